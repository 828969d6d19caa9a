"""OCI images without a Docker engine: read a base image, append one layer, write a layout or push.

Why this is written by hand: what `crane append`, ko and jib do (append a layer to a base image and push
it with the base layers mounted, not re-uploaded) has no maintained Python library. The Python OCI
clients either pull and push whole images (no cross-repository mount), drop the config history, cannot
pick one platform out of a multi-arch index, or write non-reproducible tars. The parts are small and
specified exactly by the OCI image, image-layout and distribution specs, so they live here:

- `media`: media types, canonical JSON, digests, platforms.
- `schema`: the shapes of the index, manifest and config read from outside (msgspec), checked at the
  boundary; `verified`: a blob read no further than its descriptor's size and checked against its digest.
- `layer`: deterministic tar+gzip layer writer and a streaming layer reader.
- `image`: pure "base + appended layer -> config + manifest" mutations (go-containerregistry's mutate).
- `layout`: OCI image-layout directories, read and written atomically.
- `registry`: a minimal OCI distribution client (requests) with token auth and cross-repo blob mount.
- `base`: open a base image (registry reference or layout) for one platform, with a digest-keyed blob
  cache.
- `source`: `ImageLayersSource`, the `patchkit.sources.Source` protocol over a base image's layers.
"""
