"""A --load rebuild of an image the engine already holds moves only its tags (images.local).

The classic builder has no way to skip the context: every `POST /build` uploads it whole, and the pinned
wheels' files make the layer megabytes (4p67's instanttensor: 6.5 MB compressed) even when the engine's
build cache then answers every step with the image it already has. So patchkit asks first: each image it
builds carries KEY_LABEL, the sha256 of everything the build is made of (the base's image id and
platform, the whole Dockerfile: FROM, labels, env, patchkit's version; and the layer tar's sha256), and a
build whose key an image in the engine carries is that image. Any patched byte, wheel file, label, env
value or base that differs is another key, so it builds as before.

The engine's answer is checked, not taken: the image found must carry the key and every label the build
would set, the build's env, the base's platform, and the base's layers with exactly one on top. The
engine is trusted as far as it is for the base's files read from it (sources.container_files), no further.
"""

from __future__ import annotations

import hashlib
import json

from patchkit.engine import engine_step
from patchkit.oci.base import LocalBase

KEY_LABEL = "dev.patchkit.build.key"    # on each --load image: content_key of what it was built from


def content_key(base: LocalBase, dockerfile: str, layer: bytes) -> str:
    """The key of one build: the same inputs, the same key; any byte of them changed, another."""
    parts = {"base": base.image_id, "platform": str(base.platform), "dockerfile": dockerfile,
             "layer": hashlib.sha256(layer).hexdigest()}
    return "sha256:" + hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def held_image(client, base: LocalBase, labels: dict[str, str], env: dict[str, str]) -> str | None:
    """The id of the engine's image built from these inputs (`labels` carries their key), or None; a
    candidate that fails a check is not the image (it is built again)."""
    key = labels[KEY_LABEL]
    with engine_step("looking for the image this build would make"):
        found = client.api.images(filters={"label": f"{KEY_LABEL}={key}"})
        for summary in found if isinstance(found, list) else []:
            image_id = summary.get("Id") if isinstance(summary, dict) else None
            if isinstance(image_id, str) and _is_the_build(client.api.inspect_image(image_id), base, labels, env):
                return image_id
    return None


def _is_the_build(attrs, base: LocalBase, labels: dict[str, str], env: dict[str, str]) -> bool:
    attrs = _of(attrs, dict)
    config = _of(attrs.get("Config"), dict)
    have_labels, have_env = _of(config.get("Labels"), dict), _of(config.get("Env"), list)
    layers = _of(_of(attrs.get("RootFS"), dict).get("Layers"), list)
    platform = {"os": attrs.get("Os"), "architecture": attrs.get("Architecture"), "variant": attrs.get("Variant")}
    return (all(have_labels.get(k) == v for k, v in labels.items())
            and all(f"{k}={v}" in have_env for k, v in env.items())
            and base.platform.matches(platform)
            and len(layers) == len(base.layers) + 1 and layers[:len(base.layers)] == list(base.layers))


def _of(value, kind: type[dict] | type[list]):
    """`value` where the engine answered that kind of JSON, else an empty one (which checks nothing true)."""
    return value if isinstance(value, kind) else kind()
