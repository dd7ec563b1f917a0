"""The class server's HTTP side: what only an HTTP response can do for a class (plain ASGI, no Streamlit).

``serve.py`` (what ``scripts/app.sh`` runs) wraps the app in ``ClassCookies``, a middleware Streamlit's ``st.App``
allows. A script cannot: Streamlit 1.67 gives a script no way to set a cookie, so a cookie a page script sets
(``document.cookie``) is readable by every page script, and the teacher link's key would reach the page and its
address bar before any script could take it out. Here, before the page exists:

* A GET whose address carries the teacher's key (``?teacher=TOKEN``, checked in constant time) is answered with a
  redirect to the same address without it (303): the key never reaches the page or a projected address bar. With
  the redirect the browser gets the teacher's proof (``class_session.teacher_proof``: a random nonce and its HMAC
  under the token, so a new token makes it worthless) in an HttpOnly cookie. A wrong key is left to the page, which
  says so and drops it.
* Every page a browser loads in a class carries a student identity, signed by the server
  (``class_session.signed_student``), in an HttpOnly cookie, set when the browser has none that verifies: one per
  browser, however many tabs it opens. A session answers only with the identity its own connection brought back
  (``ui.follow``), so a client that keeps no cookies cannot answer, and one client address gets at most
  ``joins_per_client()`` new identities an hour: a script cannot make voters for free.
* The cookies are ``SameSite=Strict``, and ``Secure`` when the page came over HTTPS.
"""

from __future__ import annotations

import os
from http.cookies import SimpleCookie
from urllib.parse import parse_qsl, quote, urlencode

from ui import class_session

TEACHER_PARAM = "teacher"
TEACHER_COOKIE, STUDENT_COOKIE = "headscope_teacher", "headscope_student"
COOKIE_MAX_AGE_S = int(class_session.EXPIRE_AFTER_S)
JOINS_ENV = "HEADSCOPE_CLASS_JOINS_PER_CLIENT"
JOINS_PER_CLIENT = 10  # new student identities one client address may get an hour (a class on a LAN: one each)
JOIN_WINDOW_S = 3600.0


def joins_per_client() -> int:
    """``HEADSCOPE_CLASS_JOINS_PER_CLIENT`` (default 10): raise it for a class whose browsers share one address
    (behind one NAT)."""
    try:
        return max(1, int(os.environ.get(JOINS_ENV, "") or JOINS_PER_CLIENT))
    except ValueError:
        return JOINS_PER_CLIENT


def set_cookie(name: str, value: str, secure: bool) -> bytes:
    """A ``Set-Cookie`` value: HttpOnly (no page script reads it), SameSite=Strict, for the whole site, 12 hours."""
    flags = f"; Path=/; Max-Age={COOKIE_MAX_AGE_S}; HttpOnly; SameSite=Strict" + ("; Secure" if secure else "")
    return f"{name}={value}{flags}".encode("latin-1")


def request_cookies(scope) -> dict[str, str]:
    jar = SimpleCookie()
    for key, value in scope.get("headers", ()):
        if key == b"cookie":
            try:
                jar.load(value.decode("latin-1"))
            except Exception:  # a malformed Cookie header counts as no cookie
                return {}
    return {name: morsel.value for name, morsel in jar.items()}


def client_address(scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


class ClassCookies:
    """ASGI middleware: the teacher key out of the address, the class's HttpOnly cookies (see the module).
    ``token()`` gives the class's teacher token (None: not a class, the middleware passes everything through)."""

    def __init__(self, app, token, joins: class_session.ClientLimits | None = None):
        self.app, self.token = app, token
        self.joins = joins or class_session.ClientLimits(joins_per_client(), JOIN_WINDOW_S)

    async def __call__(self, scope, receive, send):
        token = self.token() if scope.get("type") == "http" and scope.get("method") in ("GET", "HEAD") else None
        if not token:
            await self.app(scope, receive, send)
            return
        secure = scope.get("scheme") == "https"
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        keys = [value for name, value in query if name == TEACHER_PARAM]
        if keys and class_session.token_matches(keys[-1], token):
            rest = urlencode([(name, value) for name, value in query if name != TEACHER_PARAM])
            path = scope.get("root_path", "") + quote(scope.get("path", "/"))
            headers = [
                (b"location", (path + (f"?{rest}" if rest else "")).encode("latin-1")),
                (b"set-cookie", set_cookie(TEACHER_COOKIE, class_session.teacher_proof(token), secure)),
                (b"cache-control", b"no-store"),
                (b"content-length", b"0"),
            ]
            await send({"type": "http.response.start", "status": 303, "headers": headers})
            await send({"type": "http.response.body", "body": b""})
            return
        has_identity = class_session.verified_student(request_cookies(scope).get(STUDENT_COOKIE), token) is not None

        async def sending(message):
            if message.get("type") == "http.response.start" and not has_identity:
                headers = list(message.get("headers", ()))
                page = any(k.lower() == b"content-type" and v.startswith(b"text/html") for k, v in headers)
                if page and self.joins.allow(client_address(scope)):
                    headers.append(
                        (b"set-cookie", set_cookie(STUDENT_COOKIE, class_session.signed_student(token), secure))
                    )
                    message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, sending)
