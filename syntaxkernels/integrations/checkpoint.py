"""Reading the syntax parameters back from a saved transformers checkpoint.

``from_pretrained`` of a plain model class does not know the parameters ``enable_syntax_attention`` adds: it
reports them as unexpected keys and drops them. :func:`restore_parameters` reads them from the checkpoint
files (safetensors, sharded or not, or ``pytorch_model.bin``) and copies them into the re-enabled model;
:func:`quiet_syntax_keys_report` hides transformers' report about exactly those keys while loading.
:func:`syntaxkernels.integrations.transformers.load_syntax_model` puts the two together.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from typing import Dict, Iterable, Iterator, Sequence

import torch
from torch import nn

__all__ = ["read_tensors", "restore_parameters", "quiet_syntax_keys_report", "SyntaxKeysReportFilter"]

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_SYNTAX_KEY = re.compile(r"(^|\.)(syntax|syntax_gat|syntax_probe)(\.|$)")


def read_tensors(path: str, wanted: Iterable[str]) -> Dict[str, torch.Tensor]:
    """The tensors named in ``wanted`` that a checkpoint holds (CPU tensors, by name; absent names are left out).

    Args:
        path: a directory written by ``save_pretrained`` (``model.safetensors``, a sharded
            ``model.safetensors.index.json`` + shards, or ``pytorch_model.bin``), or a hub id (downloaded with
            ``huggingface_hub.snapshot_download``).
        wanted: state-dict names.
    Raises:
        ``ValueError`` when the directory holds none of those files.
    """
    from safetensors import safe_open

    if not os.path.isdir(path):
        from huggingface_hub import snapshot_download

        path = snapshot_download(path, allow_patterns=["*.safetensors", "*.json", "*.bin"])
    wanted_set = set(wanted)
    index = os.path.join(path, "model.safetensors.index.json")
    single = os.path.join(path, "model.safetensors")
    if os.path.exists(index) or os.path.exists(single):
        if os.path.exists(index):
            with open(index) as f:
                weight_map = json.load(f)["weight_map"]
            files = sorted({os.path.join(path, fn) for key, fn in weight_map.items() if key in wanted_set})
        else:
            files = [single]
        found: Dict[str, torch.Tensor] = {}
        for fn in files:
            with safe_open(fn, framework="pt") as f:
                for key in f.keys():
                    if key in wanted_set:
                        found[key] = f.get_tensor(key)
        return found
    binary = os.path.join(path, "pytorch_model.bin")
    if os.path.exists(binary):
        state = torch.load(binary, map_location="cpu", weights_only=True)
        return {k: v for k, v in state.items() if k in wanted_set}
    raise ValueError(f"no model.safetensors, model.safetensors.index.json or pytorch_model.bin in {path}")


def restore_parameters(model: nn.Module, path: str, names: Sequence[str], prefix: str) -> None:
    """Copy the parameters ``names`` of ``model`` from the checkpoint at ``path``, in place.

    A checkpoint saved from a head class (``BertForTokenClassification``: ``bert.encoder...``) and one saved
    from the base class (``encoder...``) both serve either class: each name is looked up as is and with the
    base-model ``prefix`` added or removed.

    Raises:
        ``ValueError`` when a tensor has another shape than its parameter, or when parameters are missing from
        the checkpoint (the message lists the first five).
    """
    candidates = {}
    for name in names:
        other = name[len(prefix) + 1:] if name.startswith(prefix + ".") else f"{prefix}.{name}"
        candidates[name] = (name, other)
    found = read_tensors(path, [option for options in candidates.values() for option in options])
    params = dict(model.named_parameters())
    missing = []
    with torch.no_grad():
        for name, options in candidates.items():
            key = next((o for o in options if o in found), None)
            if key is None:
                missing.append(name)
                continue
            value = found[key]
            if value.shape != params[name].shape:
                raise ValueError(f"checkpoint tensor {key} has shape {tuple(value.shape)}, the model expects "
                                 f"{tuple(params[name].shape)}")
            params[name].copy_(value)
    if missing:
        raise ValueError(f"the checkpoint at {path} lacks syntax parameters: {missing[:5]}"
                         f"{' ...' if len(missing) > 5 else ''}")


class SyntaxKeysReportFilter(logging.Filter):
    """Drops transformers' weight-loading report when all it reports is syntax parameters as UNEXPECTED.

    ``from_pretrained`` of the plain class does not know the syntax parameters and lists them as unexpected
    keys; :func:`restore_parameters` restores every one of them right after (and raises if one is missing), so
    that report says nothing useful. A report that lists anything else (missing or mismatched weights,
    other unexpected keys) is let through unchanged.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a record that cannot be formatted is not ours to judge
            return True
        if "LOAD REPORT" not in message:
            return True
        rows = []
        for line in _ANSI.sub("", message).splitlines():
            cells = [c.strip() for c in line.split("|")]
            if len(cells) < 2 or not cells[0] or set(cells[0]) <= {"-", "+"} or cells[0] == "Key":
                continue
            rows.append((cells[0], cells[1]))
        only_syntax = bool(rows) and all(status == "UNEXPECTED" and _SYNTAX_KEY.search(key) for key, status in rows)
        return not only_syntax


@contextlib.contextmanager
def quiet_syntax_keys_report() -> Iterator[None]:
    """While loading, hide the weight-loading report about syntax parameters (:class:`SyntaxKeysReportFilter`).

    A filter rather than a higher log level: transformers runs (and logs) an extra tensor-parallel plan check
    ("The following layers were not sharded: ...") whenever its loading logger's level is WARNING or above.
    """
    logger = logging.getLogger("transformers.modeling_utils")
    report_filter = SyntaxKeysReportFilter()
    logger.addFilter(report_filter)
    try:
        yield
    finally:
        logger.removeFilter(report_filter)
