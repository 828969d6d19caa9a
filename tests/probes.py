"""Per-module probe fixtures for the patch behaviour tests (the trees come from tests/conftest.py), and
the GLM-5.3 source layout of the release under test.

Release-agnostic tests: the release under test is the installed vLLM (`vllm_release` fixture, a
packaging Version); where the GLM model code lives in it is `vllm_layout` (a `GlmLayout`). A probe
imports through `layout.module("model")` and friends, never a hard-coded `common.`/`nvidia.` path.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class GlmLayout:
    """Where one release keeps GLM-5.3's model code (module paths, importable in a probe).

    0.30.0 (the default day-0 base's layout): model, attention, KDA and MTP in models/glm5next/nvidia/,
    the kpool indexer (which calls persistent_topk itself) in model_executor/layers/
    sparse_attn_indexer_kpool.py. 0.31.0-0.33.0: model code in models/glm5next/common/, the kpool indexer
    split per platform, models/glm5next/nvidia/sparse_indexer.py for CUDA."""

    name: str  # "0.30" | "0.31": the first release with this layout
    package: str  # the package holding model.py, attention.py, kda.py, mtp.py
    kpool_indexer: str  # the module defining the CUDA SparseAttnIndexerKpool

    def module(self, name: str) -> str:
        """`model` -> `vllm.models.glm5next.common.model` (or `.nvidia.model` on the 0.30 layout)."""
        return f"{self.package}.{name}"


LAYOUT_030 = GlmLayout("0.30", "vllm.models.glm5next.nvidia", "vllm.model_executor.layers.sparse_attn_indexer_kpool")
LAYOUT_031 = GlmLayout("0.31", "vllm.models.glm5next.common", "vllm.models.glm5next.nvidia.sparse_indexer")



# The start of a GLM parser probe (run inside a vLLM tree): `glm_tokenizer(template)`, a real tokenizer
# (`tokenizers` byte-level, every byte a token) with GLM's markers as added special tokens, as in GLM's
# tokenizer.json, and its chat template; `GLM_PARSER`, the parser class vLLM's chat server builds for
# `--tool-call-parser glm47 --reasoning-parser glm45 --enable-auto-tool-choice`.
GLM_PROBE_HEAD = r'''
import json
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.parser import ParserManager

GLM_SPECIAL = ["[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>", "<|endoftext|>",
               "<think>", "</think>", "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"]

def glm_tokenizer(template):
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in GLM_SPECIAL])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", chat_template=template)

GLM_PARSER = ParserManager.get_parser(tool_parser_name="glm47", reasoning_parser_name="glm45", enable_auto_tools=True)

def glm_parse(parser, hf, text, request):
    """The non-streaming parse, as the chat server calls it: what a client reads."""
    ids = hf.encode(text, add_special_tokens=False)
    reasoning, content, calls = parser.parse(text, request, enable_auto_tools=True, model_output_token_ids=ids)
    return {"reasoning": reasoning, "content": content,
            "tool_calls": [{"name": c.name, "arguments": c.arguments} for c in calls or []]}

def glm_stream(parser, hf, text, request, prompt_ids, chunk=1):
    """The streaming parse, `chunk` tokens per delta (several when MTP accepts draft tokens) with the
    rendered prompt's ids: what a client assembles."""
    ids = hf.encode(text, add_special_tokens=False)
    seen, r, c, tools = "", "", "", {}
    for start in range(0, len(ids), chunk):
        end = min(start + chunk, len(ids))
        decoded = hf.decode(ids[:end], skip_special_tokens=False)
        delta = parser.parse_delta(decoded[len(seen):], ids[start:end], request, prompt_token_ids=prompt_ids,
                                   finished=end == len(ids))
        seen = decoded
        if delta is None:
            continue
        r += delta.reasoning or ""
        c += delta.content or ""
        for call in delta.tool_calls or []:
            slot = tools.setdefault(call.index, {"name": "", "arguments": ""})
            slot["name"] += (call.function.name or "") if call.function else ""
            slot["arguments"] += (call.function.arguments or "") if call.function else ""
    return {"reasoning": r or None, "content": c or None, "tool_calls": list(tools.values())}
'''


# GLM_PROBE_HEAD plus vLLM's chat server: `chat_server(parser_cls)`, an `OpenAIServingChat` built the way
# vLLM's own tests/entrypoints/openai/chat_completion/test_serving_chat.py builds one for its generators
# (`_build_minimal_metrics_serving_chat`: `__new__` and the attributes they read; no engine runs here), and
# `engine_outputs(...)`, the engine's RequestOutputs for a completion: whole, or one token each as a
# streaming request gets them, the finish on the last.
GLM_SERVER_PROBE_HEAD = GLM_PROBE_HEAD + r'''
from unittest.mock import MagicMock
from vllm.entrypoints.generate.base.protocol import RequestResponseMetadata
from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat
from vllm.outputs import CompletionOutput, RequestOutput

def chat_server(parser_cls):
    s = OpenAIServingChat.__new__(OpenAIServingChat)
    for name, value in {"response_role": "assistant", "parser_cls": parser_cls, "enable_auto_tools": True,
                        "_include_reasoning_tokens_details": False, "enable_prompt_tokens_details": False,
                        "enable_log_outputs": False, "enable_log_deltas": False, "enable_force_include_usage": False,
                        "request_logger": None, "system_fingerprint": None, "enable_per_request_metrics": False,
                        "model_config": None, "chat_template": None, "chat_template_content_format": "auto",
                        "default_chat_template_kwargs": {}, "online_renderer": MagicMock(reasoning_effort_map={})}.items():
        setattr(s, name, value)
    return s

def engine_outputs(hf, text, prompt_ids, streamed, finish="stop", stop=None):
    """`stop`: None (EOS), one of GLM_SPECIAL (a stop token: its id) or a client's stop string."""
    ids = hf.encode(text, add_special_tokens=False)
    stop_reason = hf.convert_tokens_to_ids(stop) if stop in GLM_SPECIAL else stop
    steps, seen = ([(text, ids)] if not streamed else []), ""
    for n in range(len(ids) if streamed else 0):
        decoded = hf.decode(ids[: n + 1], skip_special_tokens=False)
        steps.append((decoded[len(seen):], ids[n: n + 1]))
        seen = decoded
    for n, (piece, token_ids) in enumerate(steps):
        last = n == len(steps) - 1
        yield RequestOutput(request_id="r", prompt=None, prompt_token_ids=prompt_ids, prompt_logprobs=None,
                            outputs=[CompletionOutput(index=0, text=piece, token_ids=token_ids, cumulative_logprob=None,
                                                      logprobs=None, finish_reason=finish if last else None,
                                                      stop_reason=stop_reason if last else None)],
                            finished=last)
'''


def patches_under_test():
    """The patch set the behaviour tests run: the checkout's, or the one `patchkit rebase` hands them
    (PATCHKIT_TEST_PATCHES, a rebased copy)."""
    from patchkit.patching.patchset import load_patchset

    return load_patchset(os.environ.get("PATCHKIT_TEST_PATCHES") or REPO / "patches")


def glm_layout(vllm_package: Path) -> GlmLayout:
    """The layout of the vLLM package directory `vllm_package` (…/site-packages/vllm), read off its files."""
    if (vllm_package / "models" / "glm5next" / "common" / "model.py").exists():
        return LAYOUT_031
    if (vllm_package / "models" / "glm5next" / "nvidia" / "model.py").exists():
        return LAYOUT_030
    raise AssertionError(f"{vllm_package}: no GLM-5.3 model code in either known layout (0.30 nvidia/, 0.31 common/)")


# Before 0.33.0, SiluAndMul binds the CPU build's `_C.silu_and_mul` when it is constructed on a CPU
# platform; the wheel installed here is the CUDA build, with no CPU op library. A probe that builds a
# model with a dense MLP starts with this: the op gets vLLM's own forward_native as its body (building
# and loading a model never runs it).
CPU_SILU_AND_MUL = """
import torch
from vllm.model_executor.layers.activation import SiluAndMul
if not hasattr(torch.ops._C, "silu_and_mul"):
    _silu_lib = torch.library.Library("_C", "DEF")
    _silu_lib.define("silu_and_mul(Tensor(a!) out, Tensor input) -> ()")
    _silu_lib.impl("silu_and_mul", lambda out, x: out.copy_(SiluAndMul.forward_native(x)), "CPU")
"""


def probe_fixtures(code, env: dict[str, str] | None = None):
    """Module-scoped `stock` and `patched` fixtures: `code` run once in each tree, its JSON result.

    `code` is the probe's source, or a function of the release's GlmLayout returning it (for a probe
    that imports GLM modules whose place differs between releases: `lambda layout: PROBE.replace(...)`).
    Usage in a patch's test module: `stock, patched = probe_fixtures(PROBE, ENV)`.
    """

    def source(layout: GlmLayout) -> str:
        return code(layout) if callable(code) else code

    @pytest.fixture(scope="module")
    def stock(stock_vllm, vllm_layout):
        return stock_vllm.run(source(vllm_layout), env=env)

    @pytest.fixture(scope="module")
    def patched(patched_vllm, vllm_layout):
        return patched_vllm.run(source(vllm_layout), env=env)

    return stock, patched


# -- assert-only patches: upstream has no bug to show, so prove the guard itself ---------------------------


def guard_in_series(patch_id: str, tree_root):
    """The assert patch is in the series that built the patched tree (honouring PATCHKIT_TEST_EXCLUDE, as
    tests/conftest.py does) and every invariant holds there."""

    from patchkit.patching import planner
    from patchkit.sources.directory import DirectorySource

    excluded = {i for i in os.environ.get("PATCHKIT_TEST_EXCLUDE", "").split(",") if i}
    patchset = patches_under_test()
    assert patch_id in [p.id for p in patchset.series() if p.id not in excluded], f"{patch_id} left out of the series"
    result = planner.plan([patchset.patch(patch_id)], DirectorySource(tree_root)).result(patch_id)
    assert result.state == planner.State.APPLIED, result.describe()
    assert {e.state for e in result.edits} == {"holds"}


def plan_on_drifted_upstream(patch_id: str, old: str, new: str, tmp_path):
    """The patch planned on the installed vLLM's target files in which upstream changed `old` into `new`."""
    from importlib.metadata import version

    from builders import write_package
    from patchkit.patching import planner
    from patchkit.patching.copies import installed_package
    from patchkit.sources.directory import DirectorySource


    patch = patches_under_test().patch(patch_id)
    installed = installed_package("vllm")
    files = {c: (installed / c).read_text() for e in patch.edits for c in e.candidates if (installed / c).exists()}
    assert any(old in text for text in files.values()), f"{old!r} is not in the installed vLLM"
    root = write_package(tmp_path / "site", {k: v.replace(old, new) for k, v in files.items()}, version=version("vllm"))
    return planner.plan([patch], DirectorySource(root)).result(patch_id)
