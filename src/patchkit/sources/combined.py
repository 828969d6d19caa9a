"""Several sources seen as one (vLLM from one place, FlashInfer from another)."""

from __future__ import annotations

from patchkit.errors import PatchkitError
from patchkit.sources.base import Source, SourceDefaults, check_package, relative_path


class PackageInTwoSources(PatchkitError):
    """Two of the sources given hold the same package (exit 2): the `package` and the `sources`' descriptions."""

    def __init__(self, package: str, sources: tuple[str, str]):
        self.package, self.sources = package, sources
        super().__init__(f"package {package} is in two sources: {sources[0]} and {sources[1]}; give it once")


class CombinedSource(SourceDefaults):
    """Each package read from the one source that holds it; files beside the packages belong to no one
    source, so there are none (`distribution_file` is None)."""

    def __init__(self, sources: list[Source]):
        self._by_package: dict[str, Source] = {}
        for source in sources:
            for package in source.versions():
                if package in self._by_package:
                    raise PackageInTwoSources(package, (self._by_package[package].description, source.description))
                self._by_package[package] = source
        self.sources = list(sources)
        self.description = " + ".join(source.description for source in sources)

    def versions(self) -> dict[str, str]:
        return {package: source.versions()[package] for package, source in self._by_package.items()}

    def read(self, package: str, path: str) -> bytes | None:
        return self.read_many(package, [path])[path]

    def read_many(self, package: str, paths: list[str]) -> dict[str, bytes | None]:
        check_package(package)
        source = self._by_package.get(package)
        if source is None:
            for path in paths:
                relative_path(path)  # a bad path is an error whether or not the package is here
            return dict.fromkeys(paths)
        return source.read_many(package, paths)

    def package_files(self, package: str) -> list[str] | None:
        source = self._by_package.get(package)
        return None if source is None else source.package_files(package)


def combine_sources(sources: list[Source]) -> Source:
    if not sources:
        raise PatchkitError("no source given (a patchkit bug: please report it; every command asks for one)")
    return sources[0] if len(sources) == 1 else CombinedSource(sources)
