"""`-hf REPO[:QUANT]` and `-hff FILE`: a GGUF model from a Hugging Face repository,
chosen as llama.cpp chooses it and downloaded with huggingface_hub into its cache
(HF_HOME / HF_HUB_CACHE; HF_HUB_OFFLINE=1 uses only what is cached; HF_TOKEN for
gated repositories).

llama.cpp's rules (common/download.cpp): the quant tag is case-insensitive and matches
a file whose path has TAG followed by "." or "-"; without a tag Q4_K_M is tried, then
Q8_0, then the first GGUF of the repository. Projector, imatrix and draft-model files
are never the model. Of a model split in files NAME-0000i-of-0000N.gguf only the first
is chosen. A repository that cannot be listed (offline, no network) is looked up in
the cache."""
from __future__ import annotations

import pathlib
import posixpath
import re

from .common import CliError

DEFAULT_TAGS = ("Q4_K_M", "Q8_0")
NOT_MODELS = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-")
_SPLIT = re.compile(r"^(.+)-(\d{5})-of-(\d{5})\.gguf$", re.I)


def split_repo_tag(value: str) -> tuple[str, str]:
    repo, *rest = value.split(":")
    if len(repo.split("/")) != 2 or not all(repo.split("/")):
        raise CliError(f"invalid -hf {value!r}: expected <user>/<model>[:quant]")
    return repo, rest[-1] if rest else ""


def split_part(path: str) -> tuple[str, int, int]:
    """(prefix, index, count) of a GGUF file; count 1 for a file that is not split."""
    m = _SPLIT.match(path)
    return (m[1], int(m[2]), int(m[3])) if m else (path, 1, 1)


def is_model(path: str) -> bool:
    name = posixpath.basename(path)
    return name.endswith(".gguf") and not any(k in name for k in NOT_MODELS)


def pick(files: list[str], tag: str) -> str | None:
    """The model file of `files` for `tag` ("" for the default), or None."""
    models = [f for f in files if is_model(f) and split_part(f)[1] == 1]
    for t in [tag] if tag else DEFAULT_TAGS:
        pattern = re.compile(re.escape(t) + "[.-]", re.I)
        found = next((f for f in models if pattern.search(f)), None)
        if found:
            return found
    return None if tag or not models else models[0]


def repo_files(repo: str) -> tuple[list[str], bool]:
    """The repository's files, and whether they come from the cache."""
    import huggingface_hub as hub

    if hub.constants.HF_HUB_OFFLINE:
        online_error = f"not in the cache {hub.constants.HF_HUB_CACHE} (HF_HUB_OFFLINE is set)"
    else:
        try:
            return sorted(hub.list_repo_files(repo)), False
        except Exception as e:      # no network, an unknown or gated repository
            online_error = first_line(e)
    try:
        snap = hub.snapshot_download(repo, local_files_only=True)
    except Exception:
        raise CliError(f"{repo}: {online_error}") from None
    root = pathlib.Path(snap)
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()), True


def first_line(e: Exception) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return lines[0] if lines else type(e).__name__


def resolve(value: str, hf_file: str | None = None) -> str:
    """The local path of the model `value` (REPO[:QUANT]) names, downloaded if need be."""
    import huggingface_hub as hub

    hub.logging.set_verbosity_error()      # its retries would be lines before ours
    repo, tag = split_repo_tag(value)
    files, cached = repo_files(repo)
    where = f"{repo} (cached)" if cached else repo
    ggufs = ", ".join(f for f in files if f.endswith(".gguf")) or "none"
    if hf_file is not None:
        if hf_file not in files:
            raise CliError(f"no file {hf_file!r} in {where}; its GGUF files: {ggufs}")
        primary = hf_file
    else:
        primary = pick(files, tag)
        if primary is None:
            what = f"no GGUF file for quant {tag!r}" if tag else "no GGUF file"
            raise CliError(f"{what} in {where}; its GGUF files: {ggufs}")
    count = split_part(primary)[2]
    if count > 1:
        raise CliError(f"{repo}: {primary} is split in {count} files; only single-file "
                       f"models can be loaded (llama-gguf-split --merge joins them)")
    try:
        return hub.hf_hub_download(repo, primary, local_files_only=cached)
    except Exception as e:
        raise CliError(f"{repo}: cannot download {primary}: {first_line(e)}") from None
