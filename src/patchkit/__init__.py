"""patchkit: anchor-asserted, fail-closed patches for vLLM, built into reproducible images."""

from pathlib import Path

__version__ = "0.1.0"

# The checkout patchkit runs from (src layout): patches/ and images/ live here, they are not packaged.
CHECKOUT = Path(__file__).resolve().parents[2]

# The release the patch set is pinned to, and the FlashInfer that release pins (requirements/cuda.txt):
# the default source of `check` and `diff`, and the baseline of `verify`.
PINNED_VLLM = "0.33.0"
# Every release the patch set supports, oldest first: what a patch's `vllm` range may claim, what nox
# builds a test environment for, and where the boot-log markers' literals are read. 0.34.0 is supported
# beside the pin, which stays on 0.33.0 until every patch's behaviour tests have a recorded pass there.
SUPPORTED_VLLM = ("0.30.0", "0.31.0", "0.32.0", PINNED_VLLM, "0.34.0")
PINNED_FLASHINFER = "0.7.2.post1"
PINNED_SOURCES = (f"vllm=={PINNED_VLLM}", f"flashinfer-python=={PINNED_FLASHINFER}")
