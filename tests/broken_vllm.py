"""A plausible wrong mapping of vLLM's CPU paged-attention kernel, for tests/test_vllm_adapter.py:
the library caches filled by copying the pages in (the kernel's head-major ``(P, g, S, D)`` shape),
without the library's own write, whose packed layout the kernel reads. Imported only where vllm
is installed."""

from __future__ import annotations

from mhaspec.backends import vllm_native


class CopiedCache(vllm_native.VllmCpuPaged):
    """``vllm-cpu-paged`` with the caches copied from the pages instead of written by
    ``cpu_attn_reshape_and_cache``."""

    deviations = {}

    def library_cache(self, k_pages, v_pages, width: int, chosen: str):
        caches = []
        for pages in (k_pages, v_pages):
            pad = width - pages.shape[3]
            padded = vllm_native.torch_module().nn.functional.pad(pages, (0, pad))
            caches.append(padded.permute(0, 2, 1, 3).contiguous())  # (P, g, S, D)
        return caches[0], caches[1]


COPIED_CACHE = CopiedCache("vllm-cpu-paged-copied-cache")
