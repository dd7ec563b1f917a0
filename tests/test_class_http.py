"""The class server's HTTP side (ui/class_http.py), as plain ASGI: requests in, responses out, no server.

The teacher link is answered with a redirect without its key and an HttpOnly proof; every page a browser loads
carries one HttpOnly student identity the server signed (set once per browser), Secure over HTTPS; one client
address gets at most a set number of identities; outside a class nothing changes."""

from __future__ import annotations

import asyncio

from ui import class_http, class_session

TOKEN = "http-teacher-" + "t" * 24


def page_app(content_type: bytes = b"text/html; charset=utf-8"):
    """A stand-in for Streamlit's server: every GET is its page (or another kind of file)."""

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", content_type)]})
        await send({"type": "http.response.body", "body": b"<html></html>"})

    return app


def get(middleware, path: str = "/", query: str = "", cookie: str = "", scheme: str = "http", client="10.0.0.5"):
    scope = {
        "type": "http",
        "method": "GET",
        "scheme": scheme,
        "path": path,
        "root_path": "",
        "query_string": query.encode(),
        "headers": [(b"cookie", cookie.encode())] if cookie else [],
        "client": (client, 50000),
    }
    sent = []

    async def receive():
        return {"type": "http.request"}

    async def send(message):
        sent.append(message)

    asyncio.run(middleware(scope, receive, send))
    start = sent[0]
    headers = [(k.decode(), v.decode()) for k, v in start.get("headers", [])]
    return start["status"], headers


def set_cookies(headers) -> dict[str, str]:
    return {v.split("=", 1)[0]: v for k, v in headers if k == "set-cookie"}


def cookie_value(set_cookie: str) -> str:
    return set_cookie.split(";")[0].split("=", 1)[1]


def test_the_teacher_link_is_redirected_without_its_key():
    middleware = class_http.ClassCookies(page_app(), token=lambda: TOKEN)
    status, headers = get(middleware, "/explore", f"layer=3&teacher={TOKEN}&text=a+b")
    assert status == 303
    assert dict(headers)["location"] == "/explore?layer=3&text=a+b"  # the rest of the link kept, the key gone
    proof = set_cookies(headers)[class_http.TEACHER_COOKIE]
    assert "HttpOnly" in proof and "SameSite=Strict" in proof and "Path=/" in proof and "Secure" not in proof
    assert class_session.proof_matches(cookie_value(proof), TOKEN) and TOKEN not in proof
    assert dict(headers)["cache-control"] == "no-store"
    # Over HTTPS the cookie is Secure; a link with only the key goes to the bare page.
    status, headers = get(middleware, "/", f"teacher={TOKEN}", scheme="https")
    assert (status, dict(headers)["location"]) == (303, "/")
    assert "; Secure" in set_cookies(headers)[class_http.TEACHER_COOKIE]
    # A wrong key is the page's to report: no redirect, no proof.
    status, headers = get(middleware, "/explore", "teacher=wrong")
    assert status == 200 and class_http.TEACHER_COOKIE not in set_cookies(headers)


def test_one_signed_student_identity_per_browser():
    middleware = class_http.ClassCookies(page_app(), token=lambda: TOKEN)
    status, headers = get(middleware, "/classroom")
    identity = set_cookies(headers)[class_http.STUDENT_COOKIE]
    assert status == 200 and "HttpOnly" in identity and "SameSite=Strict" in identity and "Secure" not in identity
    student = class_session.verified_student(cookie_value(identity), TOKEN)
    assert student is not None
    # The browser sends it back: no new one (its tabs and reloads keep the one it has).
    _, headers = get(middleware, "/explore", cookie=f"{class_http.STUDENT_COOKIE}={cookie_value(identity)}")
    assert class_http.STUDENT_COOKIE not in set_cookies(headers)
    # One the server did not sign is no identity: the browser gets a real one.
    forged = f"{class_session.new_student_id()}.{'0' * 32}"
    _, headers = get(middleware, "/", cookie=f"{class_http.STUDENT_COOKIE}={forged}")
    assert class_session.verified_student(cookie_value(set_cookies(headers)[class_http.STUDENT_COOKIE]), TOKEN)
    _, headers = get(middleware, "/", scheme="https", client="10.0.0.6")
    assert "; Secure" in set_cookies(headers)[class_http.STUDENT_COOKIE]
    # Files that are not a page (scripts, images) carry no identity.
    _, headers = get(class_http.ClassCookies(page_app(b"text/javascript"), token=lambda: TOKEN), "/static/app.js")
    assert not set_cookies(headers)
    _, headers = get(middleware, "/", cookie="a=b; =;;; junk")  # a malformed Cookie header: a new identity
    assert class_http.STUDENT_COOKIE in set_cookies(headers)


def test_one_client_address_gets_a_bounded_number_of_identities():
    joins = class_session.ClientLimits(3, window_s=3600)
    middleware = class_http.ClassCookies(page_app(), token=lambda: TOKEN, joins=joins)
    minted = [class_http.STUDENT_COOKIE in set_cookies(get(middleware, "/", client="10.0.0.9")[1]) for _ in range(40)]
    assert minted == [True] * 3 + [False] * 37  # 40 page loads without cookies: 3 identities, then none
    assert class_http.STUDENT_COOKIE in set_cookies(get(middleware, "/", client="10.0.0.10")[1])  # another address
    assert class_http.joins_per_client() >= 1


def test_outside_a_class_nothing_changes():
    middleware = class_http.ClassCookies(page_app(), token=lambda: None)
    status, headers = get(middleware, "/explore", f"teacher={TOKEN}")
    assert status == 200 and not set_cookies(headers)


def test_a_timer_request_naming_a_page_the_session_left_is_dropped():
    """The server starts a full run of page A (its new_session); then the browser's requests arrive: a fragment
    timer's naming page B (sent before it took in the move to A) never reaches the app; the timer's naming A, a
    click in a fragment and a full rerun naming B do (a person may move, a timer never does)."""
    from streamlit.proto.BackMsg_pb2 import BackMsg
    from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

    def request(page: str, fragment: str = "", auto: bool = False) -> bytes:
        message = BackMsg()
        message.rerun_script.page_script_hash = page
        message.rerun_script.fragment_id = fragment
        message.rerun_script.is_auto_rerun = auto
        return message.SerializeToString()

    started = ForwardMsg()
    started.new_session.page_script_hash = "page-a"
    started.metadata.run.script_run_id = "run-1"
    in_fragment = ForwardMsg()  # a fragment's run of another page does not move the page the guard knows
    in_fragment.new_session.page_script_hash = "page-b"
    in_fragment.metadata.run.fragment_ids.append("poll")
    incoming = [
        request("page-b", "poll", auto=True),
        request("page-a", "poll", auto=True),
        request("page-b", "answers"),
        request("page-b"),
    ]
    received = []

    async def app(scope, receive, send):
        await send({"type": "websocket.send", "bytes": started.SerializeToString()})
        await send({"type": "websocket.send", "bytes": in_fragment.SerializeToString()})
        while True:
            message = await receive()
            if message["type"] == "websocket.disconnect":
                return
            received.append(BackMsg.FromString(message["bytes"]).rerun_script)

    async def receive():
        if incoming:
            return {"type": "websocket.receive", "bytes": incoming.pop(0)}
        return {"type": "websocket.disconnect"}

    async def send(message):
        pass

    asyncio.run(class_http.StalePageGuard(app)({"type": "websocket"}, receive, send))
    assert [(r.page_script_hash, r.fragment_id, r.is_auto_rerun) for r in received] == [
        ("page-a", "poll", True),
        ("page-b", "answers", False),
        ("page-b", "", False),
    ]
