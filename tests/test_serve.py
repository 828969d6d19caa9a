"""serve-args and the MTP exclusion override it derives from a verified config."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from patchkit.checkpoint.identity import PinMismatch, sha256_bytes
from patchkit.checkpoint.mtp_ignore import (
    MtpIgnoreRefused,
    extended_quantization_config,
    hf_overrides,
    patterns,
    predictor_layers,
)
from patchkit.checkpoint.quant_config import QuantMismatch
from patchkit.checkpoint.serve import NodeRankOutOfRange, serve_args, serve_command
from patchkit.smoke.synthetic_config import write_header_set
from patchkit.smoke.synthetic_layout import LAYOUTS, TINY_DIMS
from patchkit.variants.definitions import find_variant, load_variants
from patchkit.variants.pins import PinContradicted

IMAGES = Path(__file__).resolve().parents[1] / "images"

NVIDIA_LIKE = {
    "architectures": ["Glm5NextForConditionalGeneration"],
    "text_config": {"num_hidden_layers": 45, "num_nextn_predict_layers": 1},
    "quantization_config": {
        "quant_method": "modelopt",
        "quant_algo": "NVFP4",
        "ignore": ["lm_head", "model.language_model.layers.0.self_attn*"],
        "config_groups": {"group_0": {"targets": ["Linear"]}},
        "kv_cache_scheme": {"dynamic": False, "num_bits": 8, "type": "float"},
    },
}
EXPECTED_45 = [
    "model.layers.45.*",
    "model.language_model.layers.45.*",
    "language_model.model.layers.45.*",
    "model.layers.45.mtp_block.*",
]


# ------------------------------------------------------------ mtp_ignore


def test_override_appends_all_spellings_and_keeps_everything_else():
    before = copy.deepcopy(NVIDIA_LIKE)
    over = hf_overrides(NVIDIA_LIKE)
    assert before == NVIDIA_LIKE, "the input config must not be mutated"
    quant = over["quantization_config"]
    assert quant["ignore"] == ["lm_head", "model.language_model.layers.0.self_attn*", *EXPECTED_45]
    rest = {k: v for k, v in quant.items() if k != "ignore"}
    assert rest == {k: v for k, v in NVIDIA_LIKE["quantization_config"].items() if k != "ignore"}


def test_two_predictor_layers_and_top_level_counts():
    config = copy.deepcopy(NVIDIA_LIKE)
    del config["text_config"]
    config.update(num_hidden_layers=10, num_nextn_predict_layers=2)
    assert predictor_layers(config) == range(10, 12)
    added = hf_overrides(config)["quantization_config"]["ignore"][2:]
    assert added == patterns(range(10, 12)) and len(added) == 8 and "model.layers.11.mtp_block.*" in added


def test_exclude_modules_only_config_gets_an_ignore_key_vllm_reads_first():
    config = copy.deepcopy(NVIDIA_LIKE)
    config["quantization_config"]["exclude_modules"] = config["quantization_config"].pop("ignore")
    quant = hf_overrides(config)["quantization_config"]
    assert quant["ignore"] == ["lm_head", "model.language_model.layers.0.self_attn*", *EXPECTED_45]
    assert quant["exclude_modules"] == ["lm_head", "model.language_model.layers.0.self_attn*"]


@pytest.mark.parametrize(
    "listed",
    [
        EXPECTED_45,
        ["model.layers.45*", "model.language_model.layers.45*", "language_model.model.layers.45*"],
    ],
)
def test_not_applied_when_the_checkpoint_already_lists_its_mtp(listed):
    config = copy.deepcopy(NVIDIA_LIKE)
    config["quantization_config"]["ignore"] += listed
    assert extended_quantization_config(config) is None


def test_partially_listed_mtp_gets_only_the_missing_spellings():
    config = copy.deepcopy(NVIDIA_LIKE)
    config["quantization_config"]["ignore"].append("model.language_model.layers.45*")
    added = hf_overrides(config)["quantization_config"]["ignore"][3:]
    assert added == ["model.layers.45.*", "language_model.model.layers.45.*", "model.layers.45.mtp_block.*"]


def _broken(edit):
    config = copy.deepcopy(NVIDIA_LIKE)
    edit(config)
    return config


@pytest.mark.parametrize(
    ("config", "field", "found"),
    [
        (_broken(lambda c: c.pop("quantization_config")), "quantization_config", None),
        (_broken(lambda c: c.update(quantization_config=[1])), "quantization_config", [1]),
        (_broken(lambda c: c["quantization_config"].update(quant_method="compressed-tensors")),
         "quantization_config.quant_method", "compressed-tensors"),
        (_broken(lambda c: c["quantization_config"].update(quant_algo="MIXED_PRECISION")),
         "quantization_config.quant_algo", "MIXED_PRECISION"),
        (_broken(lambda c: c["quantization_config"].pop("quant_algo")), "quantization_config.quant_algo", None),
        (_broken(lambda c: c["quantization_config"].pop("ignore")), "quantization_config.ignore", None),
        (_broken(lambda c: c["quantization_config"].update(ignore="lm_head")), "quantization_config.ignore", "lm_head"),
        (_broken(lambda c: c["quantization_config"].update(ignore=["lm_head", 3])), "quantization_config.ignore",
         ["lm_head", 3]),
        (_broken(lambda c: c["quantization_config"].update(quantization={})), "quantization_config.quantization", {}),
        (_broken(lambda c: c["text_config"].pop("num_nextn_predict_layers")), "num_nextn_predict_layers", None),
        (_broken(lambda c: c["text_config"].update(num_nextn_predict_layers=0)), "num_nextn_predict_layers", 0),
        (_broken(lambda c: c["text_config"].pop("num_hidden_layers")), "num_hidden_layers", None),
        (_broken(lambda c: c["text_config"].update(num_hidden_layers="45")), "text_config.num_hidden_layers", "45"),
        (_broken(lambda c: c["text_config"].update(num_hidden_layers=True)), "text_config.num_hidden_layers", True),
        (_broken(lambda c: c.update(num_hidden_layers=44)), "num_hidden_layers",
         {"num_hidden_layers": 44, "text_config.num_hidden_layers": 45}),
        (_broken(lambda c: c.update(text_config=[])), "text_config", []),
    ],
)
def test_malformed_configs_fail_closed(config, field, found):
    with pytest.raises(MtpIgnoreRefused) as info:
        hf_overrides(config)
    assert (info.value.field, info.value.found) == (field, found)


def test_a_refused_config_names_the_field_what_was_expected_and_found():
    with pytest.raises(MtpIgnoreRefused, match=r"config.json: quantization_config.ignore: expected a list of "
                                               r"strings, found 'lm_head'"):
        hf_overrides(_broken(lambda c: c["quantization_config"].update(ignore="lm_head")))


# ------------------------------------------------------------ serve-args


def _checkpoint(tmp_path: Path, variant: str) -> tuple[Path, str, str]:
    root = tmp_path / variant
    write_header_set(root, LAYOUTS[variant], TINY_DIMS, shards=2)
    return (
        root,
        sha256_bytes((root / "config.json").read_bytes()),
        sha256_bytes((root / "model.safetensors.index.json").read_bytes()),
    )


def test_command_carries_the_serve_contract():
    for variant in load_variants(IMAGES).values():
        cmd = serve_command(variant)
        argv = list(cmd.argv)
        assert argv[:3] == ["vllm", "serve", variant.checkpoint.repo]

        def value(flag, argv=argv):
            return argv[argv.index(flag) + 1]

        assert value("--served-model-name") == "glm53"
        assert value("--tensor-parallel-size") == "2"
        assert value("--kv-cache-memory-bytes") == "10737418240"
        assert value("--kv-cache-dtype") == "fp8_ds_mla"
        assert value("--quantization") == variant.quantization
        if variant.serve.speculative:
            spec = json.loads(value("--speculative-config"))
            assert spec == {"method": "mtp", "num_speculative_tokens": variant.serve.speculative.num_speculative_tokens}
        else:
            assert "--speculative-config" not in argv
        assert cmd.env == variant.serve.env
        assert cmd.complete == (not variant.checkpoint.exclude_mtp_from_quant)


def test_nvidia_without_checkpoint_is_marked_pending():
    cmd = serve_command(find_variant("nvidia-nvfp4", IMAGES))
    assert not cmd.complete and "--hf-overrides" not in cmd.argv
    assert cmd.shell().startswith("# PENDING: --hf-overrides")
    assert "--revision 423acf37583782c51c142d145aef733d72943d93" in cmd.shell()


def test_nvidia_override_derived_only_after_identity(tmp_path):
    variant = find_variant("nvidia-nvfp4", IMAGES)
    root, _, _ = _checkpoint(tmp_path, "nvidia-nvfp4")
    # The variant's real pins do not match this synthetic checkpoint: refused before any parse.
    with pytest.raises(PinMismatch) as before:
        serve_args(variant, root)
    assert before.value.pin == variant.checkpoint.pins.config_sha256
    # A config that is not even JSON must not be read at all when its hash is wrong.
    (root / "config.json").write_text("{not json")
    with pytest.raises(PinMismatch) as unparsed:
        serve_args(variant, root)
    assert unparsed.value.path == root / "config.json"


def test_override_on_a_verified_checkpoint(tmp_path):
    mixed = find_variant("4p67", IMAGES)  # unpinned, so the user's pins reach the declaration check
    nvidia = find_variant("nvidia-nvfp4", IMAGES)
    root, config_sha, index_sha = _checkpoint(tmp_path, "nvidia-nvfp4")
    # Re-point an unpinned copy of the variant at the synthetic checkpoint (user-supplied pins).
    from dataclasses import replace

    from patchkit.variants.definitions import Pins

    unpinned = replace(nvidia, checkpoint=replace(nvidia.checkpoint, pins=Pins(None, None)))
    cmd = serve_args(unpinned, root, pin_config=config_sha, pin_index=index_sha)
    assert cmd.complete
    override = json.loads(cmd.argv[cmd.argv.index("--hf-overrides") + 1])
    config = json.loads((root / "config.json").read_text())
    assert override == {"quantization_config": dict(
        config["quantization_config"], ignore=config["quantization_config"]["ignore"] + EXPECTED_45
    )}
    # The 4p67 variant is another checkpoint: its layout does not match this config.
    with pytest.raises(QuantMismatch) as other:
        serve_args(mixed, root, pin_config=config_sha, pin_index=index_sha)
    assert (other.value.declares, other.value.expects) == ("modelopt NVFP4", "modelopt MIXED_PRECISION")
    # The pinned lab variant refuses these files before reading them.
    with pytest.raises(PinContradicted) as pinned:
        serve_args(find_variant("lab", IMAGES), root, pin_config=config_sha, pin_index=index_sha)
    assert pinned.value.variant == "lab"


def test_for_node_adds_multinode_flags():
    cmd = serve_command(find_variant("lab", IMAGES))
    assert cmd.for_node(0, 1, "h") == cmd.argv
    head, worker = cmd.for_node(0, 2, "10.0.0.1"), cmd.for_node(1, 2, "10.0.0.1")
    assert head[-6:] == ("--nnodes", "2", "--node-rank", "0", "--master-addr", "10.0.0.1")
    assert worker[-1] == "--headless" and worker[worker.index("--node-rank") + 1] == "1"
    with pytest.raises(NodeRankOutOfRange, match=r"node rank 2 outside 0\.\.1") as info:
        cmd.for_node(2, 2, "h")
    assert (info.value.rank, info.value.nnodes) == (2, 2)


@pytest.mark.vllm
def test_vllm_parser_accepts_every_variant_command(stock_vllm):
    """Every flag must exist in each supported release: parse each argv with the test environment's own
    vLLM serve parser (noxfile.py runs this in every release's environment; the `stock_vllm` fixture
    fails, never skips, when PATCHKIT_REQUIRE_VLLM=1)."""
    argvs = [list(serve_command(v).argv[2:]) for v in load_variants(IMAGES).values()]
    code = f"""
import json
from vllm.entrypoints.cli.serve import ServeSubcommand
from vllm.utils.argparse_utils import FlexibleArgumentParser
out = []
for argv in json.loads({json.dumps(json.dumps(argvs))}):
    parser = FlexibleArgumentParser()
    sub = parser.add_subparsers()
    ServeSubcommand().subparser_init(sub)
    ns = parser.parse_args(["serve", *argv])
    out.append([ns.model_tag, ns.quantization, ns.kv_cache_memory_bytes, ns.tensor_parallel_size,
                ns.served_model_name, ns.language_model_only])
print(json.dumps(out))
"""
    parsed = stock_vllm.run(code, env={"VLLM_TARGET_DEVICE": "cpu"}, timeout=300)
    assert len(parsed) == len(argvs) == len(load_variants(IMAGES))
    for v, row in zip(load_variants(IMAGES).values(), parsed, strict=True):
        assert row == [v.checkpoint.repo, v.quantization, 10737418240, 2, ["glm53"], True]
