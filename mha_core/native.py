"""Kernels in C, built at first use with this machine's C compiler and loaded with ctypes (no torch headers, no
build step at install), both in ``kernels/rows.c``: ``row_pass``, the long pass's one trip over a block of scores, and
``attend``, one sequence's dense attention a block of query rows at a time (``attention.scaled_dot_product_attention``
for ``MultiHeadAttention``'s one-sequence layout).

The library is built once per source, compiler and processor (``-march=native``) into ``native/`` of Headscope's
cache (``mha_core.cache.cache_dir``: ``$HEADSCOPE_CACHE_DIR`` or ``~/.cache/headscope``), written
under a temporary name and renamed, so that processes building it at once never load half a file. Without a
compiler (or with ``HEADSCOPE_NATIVE=0``, or ``USE_NATIVE = False``) ``available()`` is False and the callers take
their torch path, which computes the same numbers in several passes; ``why_not()`` says why.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import NamedTuple

import torch

from .cache import cache_dir

SOURCE = Path(__file__).with_name("kernels") / "rows.c"
# -fno-trapping-math: the selects of the vector exponential compile to blends (without it the loops stay scalar,
# 10 x slower); it changes no result.
FLAGS = ("-O3", "-march=native", "-fno-trapping-math", "-fPIC", "-shared")
OPENMP = "-fopenmp"
BUILD_TIMEOUT_S = 120
# Off: every caller takes its torch path (tests compare the two).
USE_NATIVE = os.environ.get("HEADSCOPE_NATIVE", "1") != "0"

_lock = threading.Lock()
_why_not: list[str] = []


def compiler() -> list[str] | None:
    """The command that compiles C: ``$CC`` (which may be several words, as ``ccache gcc``), else the first of cc,
    gcc, clang on the path."""
    named = os.environ.get("CC", "").split()
    if named:
        found = shutil.which(named[0])
        return [found, *named[1:]] if found else None
    return next(([found] for name in ("cc", "gcc", "clang") if (found := shutil.which(name))), None)


def _processor() -> str:
    """What ``-march=native`` compiles for: the processor's name and flags."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    wanted = ("model name", "flags", "Features", "CPU part")
    return "\n".join(dict.fromkeys(line for line in lines if line.split(":")[0].strip() in wanted))


def _build(cc: list[str], directory: Path) -> Path:
    """The shared library for this source, compiler and processor, built into ``directory`` unless it is there."""
    version = subprocess.run([*cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    key = hashlib.sha256(
        "\0".join(
            [SOURCE.read_text(), " ".join(FLAGS), " ".join(cc), version, _processor(), platform.machine()]
        ).encode()
    ).hexdigest()[:20]
    target = directory / f"rows-{key}.so"
    if target.exists():
        return target
    directory.mkdir(parents=True, exist_ok=True)
    errors = []
    for extra in ((OPENMP,), ()):  # without OpenMP (a compiler without it): one thread
        fd, partial = tempfile.mkstemp(prefix=".rows-", suffix=".so", dir=directory)
        os.close(fd)
        done = subprocess.run(
            [*cc, *FLAGS, *extra, "-o", partial, str(SOURCE), "-lm"],
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
        )
        if done.returncode == 0:
            os.replace(partial, target)
            return target
        os.unlink(partial)
        errors.append(done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}"])
    raise RuntimeError(f"{Path(cc[-1]).name} could not build {SOURCE.name}: {errors[0][0]}")


@functools.cache
def _library() -> ctypes.CDLL | None:
    with _lock:
        cc = compiler()
        if cc is None:
            named = os.environ.get("CC", "").split()
            _why_not.append(
                f"$CC ({named[0]}) is not on the path" if named else "no C compiler (cc, gcc or clang) on the path"
            )
            return None
        try:
            try:
                path = _build(cc, cache_dir() / "native")
            except OSError:  # the cache directory is not writable: this process's temporary directory
                path = _build(cc, Path(tempfile.gettempdir()) / f"headscope-native-{os.getuid()}")
            library = ctypes.CDLL(str(path))
        except (OSError, RuntimeError, subprocess.SubprocessError) as error:
            _why_not.append(str(error))
            return None
    function = library.rows_softmax
    pointer, size = ctypes.c_void_p, ctypes.c_int64
    function.argtypes = [pointer, size, size, size, size, ctypes.c_int, size, *[pointer] * 7, ctypes.c_int]
    function.restype = ctypes.c_int
    function = library.attend
    function.argtypes = [*[pointer] * 3, *[size] * 10, ctypes.c_float, ctypes.c_int, pointer, pointer, ctypes.c_int]
    function.restype = ctypes.c_int
    return library


def available() -> bool:
    """Whether ``row_pass`` and ``attend`` run in C here (``USE_NATIVE`` and the library built)."""
    return USE_NATIVE and _library() is not None


def why_not() -> str | None:
    """Why the C kernels are not used, or None when they are."""
    if not USE_NATIVE:
        return "turned off (HEADSCOPE_NATIVE=0 or mha_core.native.USE_NATIVE)"
    return None if _library() is not None else (_why_not[-1] if _why_not else "not built")


class RowPass(NamedTuple):
    """What ``row_pass`` gives of a block ``[heads, rows, keys]``, each ``[heads, rows]`` unless said."""

    log_sum_exp: torch.Tensor
    weighted_scores: torch.Tensor  # sum_j w_ij s_ij
    max_weight: torch.Tensor
    argmax: torch.Tensor  # long
    chunk_max: torch.Tensor  # [heads, rows, ceil(keys / chunk)]
    chunk_sum: torch.Tensor  # [heads, rows, ceil(keys / chunk)]


def row_pass(block: torch.Tensor, row_start: int, causal: bool, chunk: int, columns: torch.Tensor | None = None):
    """The softmax of each row of ``block [heads, rows, keys]`` (contiguous float32 scores, overwritten by the
    weights), and its ``RowPass``, in one trip over the block; a decoder's row ``row_start + r`` sees keys up to
    itself (the later ones get weight 0). ``columns [heads, keys]``, when given, gets the weights summed over the
    rows added to it. Runs on torch's number of threads. Raises RuntimeError where the library is not available."""
    library = _library() if USE_NATIVE else None
    if library is None:
        raise RuntimeError(f"the C kernels are not available: {why_not()}")
    if block.dtype != torch.float32 or block.dim() != 3 or not block.is_contiguous():
        raise ValueError("row_pass reads a contiguous float32 block [heads, rows, keys]")
    heads, rows, keys = block.shape
    if columns is not None and (columns.shape != (heads, keys) or columns.dtype != torch.float32):
        raise ValueError(f"columns must be float32 [{heads}, {keys}]")
    if columns is not None and not columns.is_contiguous():
        raise ValueError("columns must be contiguous")
    chunks = -(-keys // chunk)
    out = RowPass(
        *(torch.empty(heads, rows) for _ in range(3)),
        torch.empty(heads, rows, dtype=torch.long),
        torch.empty(heads, rows, chunks),
        torch.empty(heads, rows, chunks),
    )
    arguments = (  # rows_softmax's, in its order
        block.data_ptr(),
        heads,
        rows,
        keys,
        int(row_start),
        int(bool(causal)),
        int(chunk),
        *(tensor.data_ptr() for tensor in out),  # lse, weighted, max_weight, argmax, chunk_max, chunk_sum
        columns.data_ptr() if columns is not None else None,
        torch.get_num_threads(),
    )
    status = library.rows_softmax(*arguments)
    if status != 0:
        raise (MemoryError if status == 2 else ValueError)(f"rows_softmax failed (status {status})")
    return out


def attends(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether ``attend`` takes these: float32 CPU ``[1, heads, n, d_k]`` (the same heads and d_k), each head's block
    laid out transposed (``stride(-2) == 1``: ``MultiHeadAttention``'s one-sequence projection, ``W X^T``), and the C
    kernels available."""
    tensors = (q, k, v)
    if any(t.dim() != 4 or t.shape[0] != 1 or t.dtype != torch.float32 or t.device.type != "cpu" for t in tensors):
        return False
    if k.shape != v.shape or q.shape[1] != k.shape[1] or q.shape[-1] != k.shape[-1] or 0 in q.shape or 0 in k.shape:
        return False
    return all(t.stride(-2) == 1 for t in tensors) and available()


def attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool, weights: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(scale q k^T) v for every head, a block of 8 query rows at a time: each block's scores are computed into
    the weights' memory, turned into weights while they are in cache, and multiplied with V (torch takes a pass over
    all the scores for each step). ``q [1, heads, n_q, d_k]``, ``k``, ``v [1, heads, n_k, d_k]`` as ``attends`` wants
    them; a decoder's (``causal``) row i sees keys j <= i + n_k - n_q (a row that sees none gets zeros).

    Returns ``(output [1, heads, n_q, d_k], weights [1, heads, n_q, n_k])``; the output is a view of the heads'
    Concat, ``[1, n_q, heads * d_k]``, contiguous. ``weights``: a contiguous buffer to write them into. The same
    numbers as torch's products and softmax to float32 rounding (another order of sums; an exponential within 2 ulp).
    Runs on torch's number of threads. Raises ValueError for tensors ``attends`` refuses."""
    if not attends(q, k, v):
        if not available():
            raise RuntimeError(f"the C kernels are not available: {why_not()}")
        raise ValueError("attend reads float32 [1, heads, n, d_k] tensors laid out with stride(-2) == 1")
    _, heads, n_q, d_k = q.shape
    n_k = k.shape[-2]
    if weights is None:
        weights = torch.empty(1, heads, n_q, n_k)
    elif weights.shape != (1, heads, n_q, n_k) or weights.dtype != torch.float32 or not weights.is_contiguous():
        raise ValueError(f"weights must be a contiguous float32 [1, {heads}, {n_q}, {n_k}] buffer")
    out = torch.empty(1, n_q, heads * d_k)
    arguments = (  # attend's, in its order
        q.data_ptr(),
        k.data_ptr(),
        v.data_ptr(),
        heads,
        n_q,
        n_k,
        d_k,
        q.stride(1),
        q.stride(-1),
        k.stride(1),
        k.stride(-1),
        v.stride(1),
        v.stride(-1),
        float(scale),
        int(bool(causal)),
        weights.data_ptr(),
        out.data_ptr(),
        torch.get_num_threads(),
    )
    status = _library().attend(*arguments)
    if status != 0:
        raise (MemoryError if status == 2 else ValueError)(f"attend failed (status {status})")
    return out.view(1, n_q, heads, d_k).transpose(1, 2), weights
