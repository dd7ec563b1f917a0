"""Fresh buffers in huge pages (mha_core.pages) and the attention scores written into one."""

from __future__ import annotations

import pytest
import torch

import mha_core as mc
from mha_core import attention, pages

MB = 1 << 20


@pytest.mark.parametrize(
    ("address", "nbytes", "expected"),
    [
        (0, 8 * MB, (0, 8 * MB)),  # aligned: every page whole
        (16, 8 * MB, (2 * MB, 6 * MB)),  # 16 bytes past a boundary: the first and last pages are partial
        (2 * MB - 64, 2 * MB + 128, (2 * MB, 2 * MB)),
        (64, 3 * MB, (2 * MB, 0)),  # no whole page inside
    ],
)
def test_the_span_is_the_whole_huge_pages_inside_the_buffer(address, nbytes, expected):
    start, length = pages.huge_page_span(address, nbytes)
    assert (start, length) == expected
    if length:
        assert start % pages.HUGE_PAGE == 0 and length % pages.HUGE_PAGE == 0
        assert address <= start and start + length <= address + nbytes


def advice_log(monkeypatch):
    calls = []
    monkeypatch.setattr(pages, "_madvise", lambda: lambda start, length, flag: calls.append((start, length, flag)) or 0)
    return calls


def test_a_large_buffer_is_advised_on_its_whole_pages_and_a_small_one_is_not(monkeypatch):
    calls = advice_log(monkeypatch)
    large = pages.written_buffer((9, 1024, 1024))  # 36 MB
    assert large.shape == (9, 1024, 1024) and large.dtype == torch.float32 and large.is_contiguous()
    assert len(calls) == 1
    start, length, flag = calls[0]
    assert flag == pages.MADV_HUGEPAGE and (start, length) == pages.huge_page_span(large.data_ptr(), large.nbytes)
    assert length >= large.nbytes - 2 * pages.HUGE_PAGE
    small = pages.written_buffer((7, 1024, 1024))  # 28 MB: below MIN_BYTES
    assert small.shape == (7, 1024, 1024) and len(calls) == 1
    monkeypatch.setattr(pages, "USE_HUGE_PAGES", False)
    pages.written_buffer((9, 1024, 1024))
    assert len(calls) == 1


def test_where_the_system_gives_huge_pages_on_request_it_accepts_the_advice():
    """On Linux with transparent huge pages in "madvise" or "always" mode the advice is taken (madvise returns 0);
    elsewhere none is asked. The buffer's numbers are what is written into it either way."""
    setting = pages.THP_SETTING.read_text() if pages.THP_SETTING.exists() else ""
    advise = pages._madvise()
    if "[madvise]" in setting or "[always]" in setting:
        assert advise is not None
        buffer = torch.empty(5 * MB, dtype=torch.uint8)
        start, length = pages.huge_page_span(buffer.data_ptr(), buffer.nbytes)
        assert length >= 2 * MB and advise(start, length, pages.MADV_HUGEPAGE) == 0
    else:
        assert advise is None
    written = pages.written_buffer((4, 1024, 1024))
    written.copy_(torch.arange(4 * 1024 * 1024, dtype=torch.float32).view(4, 1024, 1024))
    assert float(written[3, 1023, 1023]) == 4 * 1024 * 1024 - 1


def test_large_scores_without_autograd_are_written_into_a_fresh_buffer_with_the_same_numbers(monkeypatch):
    """The weights of a layer at length (12 heads x 900 tokens: 38.9 MB) come from a written buffer, and equal
    torch's nn.MultiheadAttention and the autograd path's; with autograd following, none is used."""
    sizes = []
    original = attention.written_buffer
    monkeypatch.setattr(attention, "written_buffer", lambda shape, **kw: sizes.append(shape) or original(shape, **kw))
    torch.manual_seed(1)
    reference = torch.nn.MultiheadAttention(96, 12, batch_first=True).eval()
    core = mc.MultiHeadAttention.from_torch(reference).eval()
    x = torch.randn(1, 900, 96)
    expected_out, expected_weights = reference(x, x, x, need_weights=True, average_attn_weights=False)
    grad_out, grad_weights = core(x)
    assert sizes == []
    with torch.inference_mode():
        out, weights = core(x)
    assert sizes == [(1, 12, 900, 900)]
    torch.testing.assert_close(weights, expected_weights.detach(), atol=1e-5, rtol=0)
    torch.testing.assert_close(out, expected_out.detach(), atol=1e-4, rtol=0)
    torch.testing.assert_close(weights, grad_weights.detach(), atol=1e-6, rtol=0)
    torch.testing.assert_close(out, grad_out.detach(), atol=1e-5, rtol=0)
    with torch.no_grad():  # scores below MIN_BYTES (17 MB): the product allocates
        core(x[:, :600])
    assert sizes == [(1, 12, 900, 900)]
