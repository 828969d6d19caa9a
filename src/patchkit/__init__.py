"""patchkit: anchor-asserted, fail-closed patches for vLLM, built into reproducible images."""

from pathlib import Path

__version__ = "0.1.0"

# The checkout patchkit runs from (src layout): patches/ and images/ live here, they are not packaged.
CHECKOUT = Path(__file__).resolve().parents[2]

# The release the patch set is pinned to, and the FlashInfer that release pins (requirements/cuda.txt):
# the default source of `check` and `diff`, and the baseline of `verify`.
PINNED_VLLM = "0.33.0"
PINNED_FLASHINFER = "0.7.2.post1"
PINNED_SOURCES = (f"vllm=={PINNED_VLLM}", f"flashinfer-python=={PINNED_FLASHINFER}")
