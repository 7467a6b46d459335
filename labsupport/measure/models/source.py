"""A model source beside the presets: a local folder with a transformers `config.json`.

If the folder holds safetensors weights they are loaded, from that folder only (never a hub);
otherwise the model is built from its configuration with random weights, as the presets are
(which kernels run depends on shapes, dtypes and code paths, not on the weights' values). What a
run records of it (`ModelSource.record`): which of the two it was, the SHA-256 of config.json,
the architecture (the class AutoModelForCausalLM built), and the counts of the model itself
(parameters, the bytes a decode step reads: models.count_model; the byte count that decides
whether it fits comes from a copy built on the meta device, before anything is allocated), with its
SHAPE numbers (layers, heads, head size, ...), from which the chapters count bytes and operations
(run_shape).

`python -m labsupport profile` opens a folder itself; the chapters whose model is a transformers
decoder take one as their `model` parameter: for_params builds the model a live run measures (the
folder's, else its preset), chapter_config gives the sizes to a chapter that measures
tensors of its model's sizes, and require refuses, in one line, a configuration without a number the
chapter needs (GPT-2's has no RMSNorm, for one).

Everything that stops a folder is a SourceError, one line: not a model folder, a configuration
transformers cannot build, weights that do not match it (or safetensors files under names
transformers does not load), a model too large for the device's memory.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from labsupport.measure import models

# What a model from a folder may run in: the chapters' half-precision types, and float32.
DTYPES = (*models.DTYPES, "float32")
CONFIG = "config.json"
# What a step needs beside its weights, by device: the prompt's KV cache and activations, and on a
# GPU the largest buffer of the ceilings' measurements (hardware.measure_ceilings: 4 GiB) too.
HEADROOM_BYTES = {"cuda": 5 << 30, "cpu": 1 << 30}


class SourceError(ValueError):
    """A folder that cannot be profiled, said in one line."""


@dataclass(frozen=True)
class ModelSource:
    """A model folder, checked: its configuration, and the weights it holds (none: random)."""

    folder: Path
    config_sha256: str
    model_type: str
    weight_files: tuple[str, ...]
    config: object  # the transformers configuration, as AutoConfig read it

    @property
    def weights(self) -> str:
        """Where the weights came from: "loaded" (safetensors from the folder) or "random" (built
        from the configuration)."""
        return "loaded" if self.weight_files else "random"

    def record(self, model, counts: models.ModelCounts) -> dict:
        """What a run records of its model: the source, the class AutoModelForCausalLM built for it
        (its architecture) and the counts of the model it ran."""
        return {
            "folder": self.folder.name,
            "weights": self.weights,
            "weight_files": list(self.weight_files),
            "config_sha256": self.config_sha256,
            "architecture": type(model).__name__,
            "matrices": matrices(model),
            "shape": shape(model.config),
            "model_type": self.model_type,
            "parameters": counts.parameters,
            "decode_bytes": counts.decode_bytes,
            "bytes_per_parameter": counts.bytes_per_parameter,
        }


# The numbers of a decoder's configuration the chapters compute bytes and operations from.
SHAPE = (
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "hidden_size",
    "intermediate_size",
    "vocab_size",
)


def _value(config, key: str):
    """`key` of a configuration: a preset's dict, or a transformers configuration object (whose
    attribute_map names GPT-2's n_embd hidden_size, say)."""
    return config.get(key) if isinstance(config, dict) else getattr(config, key, None)


def shape(config) -> dict:
    """The SHAPE numbers of a configuration (a model's or a folder's transformers configuration, or a
    preset's dict), each under its usual name; a configuration without grouped keys or a head size has
    as many key/value heads as query heads, of hidden_size / heads each; a number it lacks is None."""
    out = {k: _value(config, k) for k in SHAPE}
    if out["num_key_value_heads"] is None:
        out["num_key_value_heads"] = out["num_attention_heads"]
    if out["head_dim"] is None and out["hidden_size"] and out["num_attention_heads"]:
        out["head_dim"] = out["hidden_size"] // out["num_attention_heads"]
    return out


def kv_bytes_per_position(shape: dict, bytes_per_value: int) -> int:
    """Bytes the KV cache holds for one position of context (one token), over all layers: a key
    and a value per key/value head, each head_dim values; `shape` as shape() or run_shape() give it."""
    return 2 * shape["num_hidden_layers"] * shape["num_key_value_heads"] * shape["head_dim"] * bytes_per_value


def run_shape(run) -> dict:
    """The SHAPE numbers of a recorded run's model: what it recorded of its model folder
    (results.model_source), else its preset's configuration."""
    src = (getattr(run, "results", None) or {}).get("model_source")
    return dict(src["shape"]) if src and "shape" in src else shape(models.preset_config(run.parameters["preset"]))


def matrices(model) -> dict[str, list[int]]:
    """The weight matrices of the model's linear layers by their module's own name (q_proj, ...,
    lm_head), the first of each name: [rows N, columns K], as a matmul of one token reads them."""
    import torch

    out = {}
    for path, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            out.setdefault(path.rsplit(".", 1)[-1], [module.out_features, module.in_features])
    return out


@contextlib.contextmanager
def _offline():
    """transformers never reaches a hub, and keeps its load report and progress bars to itself
    (a refusal is our one line)."""
    from transformers.utils import logging

    saved = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    verbosity, bars = logging.get_verbosity(), logging.is_progress_bar_enabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        logging.set_verbosity(verbosity)
        if bars:
            logging.enable_progress_bar()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _why(e: BaseException) -> str:
    """An exception as a short clause of one line."""
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= 200 else text[:199] + "…"


def open_folder(folder) -> ModelSource:
    """The model source in `folder`, its configuration read by transformers (SourceError if the
    folder is not a model or transformers cannot read its configuration)."""
    from transformers import AutoConfig

    folder = Path(folder).expanduser()
    config_file = folder / CONFIG
    if not folder.is_dir():
        raise SourceError(f"{folder} is not a folder")
    if not config_file.is_file():
        raise SourceError(f"{folder} is not a model folder: it has no {CONFIG}")
    data = config_file.read_bytes()
    try:
        json.loads(data)
        with _offline():
            config = AutoConfig.from_pretrained(folder, local_files_only=True)
    except Exception as e:  # noqa: BLE001 (whatever transformers raises on a configuration, said in one line)
        raise SourceError(f"{config_file}: transformers cannot read this configuration ({_why(e)})") from None
    return ModelSource(
        folder=folder,
        config_sha256=hashlib.sha256(data).hexdigest(),
        model_type=str(config.model_type),
        weight_files=weight_files(folder),
        config=config,
    )


SINGLE, INDEX = "model.safetensors", "model.safetensors.index.json"


def weight_files(folder: Path) -> tuple[str, ...]:
    """The safetensors files transformers loads from `folder` (the shards its index names, or the
    one file), none for a configuration alone; a SourceError for safetensors files it would not load
    (no model.safetensors, no index), which would leave the model random while seeming loaded."""
    if (folder / INDEX).is_file():
        try:
            shards = json.loads((folder / INDEX).read_text())["weight_map"].values()
        except (ValueError, KeyError, AttributeError, TypeError):
            raise SourceError(f"{folder / INDEX} is not a safetensors index (no weight_map)") from None
        return tuple(sorted(set(map(str, shards))))
    if (folder / SINGLE).is_file():
        return (SINGLE,)
    stray = sorted(p.name for p in folder.glob("*.safetensors"))
    if stray:
        raise SourceError(f"{folder} holds {stray[0]} but neither {SINGLE} nor {INDEX}: transformers would not load it")
    return ()


def torch_dtype(dtype: str):
    """The torch dtype of a name of DTYPES."""
    import torch

    if dtype not in DTYPES:
        raise SourceError(f"dtype must be one of {', '.join(DTYPES)}, not {dtype!r}")
    return getattr(torch, dtype)


def _from_config(source: ModelSource, device, dtype: str):
    """The model of `source`'s configuration with random weights, created directly on `device`."""
    import torch
    from transformers import AutoModelForCausalLM

    try:
        with _offline(), torch.device(device):
            model = AutoModelForCausalLM.from_config(source.config, dtype=torch_dtype(dtype))
    except Exception as e:  # noqa: BLE001 (an architecture transformers cannot build from this configuration)
        raise SourceError(
            f"{source.folder / CONFIG}: transformers cannot build a causal language model from it ({_why(e)})"
        ) from None
    return model.eval()


def counts(source: ModelSource, dtype: str) -> models.ModelCounts:
    """The counts of `source`'s model in `dtype`, from a copy on the meta device (no memory used)."""
    return models.count_model(_from_config(source, "meta", dtype))


def device_free_bytes(device: str) -> int:
    """Memory free for a model on `device`: the GPU's free memory, or on a CPU what the kernel
    says is available (MemAvailable)."""
    if device == "cuda":
        import torch

        return int(torch.cuda.mem_get_info()[0])
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def check_fits(source: ModelSource, c: models.ModelCounts, device: str) -> None:
    """Refuse (SourceError) a model whose weights and HEADROOM_BYTES exceed the free memory of
    `device`: said before anything is built, from the configuration's byte count."""
    need, room = c.parameters * c.bytes_per_parameter, HEADROOM_BYTES[device]
    free = device_free_bytes(device)
    if need + room > free:
        where = "the GPU" if device == "cuda" else "this machine"
        raise SourceError(
            f"{source.folder}: its weights take {need / 2**30:.1f} GiB and a step needs about "
            f"{room / 2**30:.0f} GiB more, but {where} has {free / 2**30:.1f} GiB free"
        )


def requested(params) -> ModelSource | None:
    """The model folder a chapter's parameters name (`model`, opened and checked: SourceError), or
    None where they name none (the preset runs)."""
    folder = getattr(params, "model", "")
    return open_folder(folder) if folder else None


def require(src: ModelSource, chapter: str, needs: dict[str, str]) -> dict:
    """The configuration of `src` as a dict with its SHAPE numbers filled in, or a SourceError naming
    the first of `needs` ({configuration key: what the chapter uses it for}) it lacks: a chapter
    refuses, before it measures, a model without what it measures."""
    config = {**src.config.to_dict(), **{k: _value(src.config, k) for k in needs}}
    config.update({k: v for k, v in shape(src.config).items() if v is not None})
    for key, what in needs.items():
        if config.get(key) is None:
            raise SourceError(
                f"{src.folder}: {chapter} needs {what}, and this {src.model_type} configuration has no {key}"
            )
    return config


def chapter_config(params, chapter: str, needs: dict[str, str]) -> tuple[dict, dict]:
    """For a chapter that measures tensors of its model's sizes, never the model itself: the
    configuration its live run takes them from, and what the run records of the model. Its
    preset's configuration, nothing more recorded; or, with a `model` folder, the folder's
    (require: refused in one line where it lacks one of `needs`) and `model_source`, counted from a
    copy on the meta device, its `weights` "shapes only" (the folder's weights are never read)."""
    src = requested(params)
    if src is None:
        return models.preset_config(params.preset), {}
    config = require(src, chapter, needs)
    model = _from_config(src, "meta", params.dtype)
    record = src.record(model, models.count_model(model))
    return config, {"model_source": {**record, "weights": "shapes only", "weight_files": []}}


def for_params(params, device: str, progress=print):
    """The model a chapter's live run measures, and what the run records of it: with a `model` folder
    (requested), its model and both records as load() gives them; else its preset, with its counts
    as `model`."""
    src = requested(params)
    if src is None:
        progress(f"building {params.preset} with random {models.dtype_label(params.dtype)} weights on {device}")
        model = models.build_model(params.preset, device=device, dtype=params.dtype)
        return model, {"model": models.count_model(model, params.preset).as_record()}
    return load(src, device, params.dtype, progress)


def load(src: ModelSource, device: str, dtype: str, progress=print):
    """The model of folder `src` on `device` (refused before it is built where it cannot fit:
    check_fits), and what a run records of it: `model` (its counts as it runs, its weights loaded
    or made) and `model_source` (ModelSource.record). The chapters (for_params) and `profile`
    share it."""
    c = counts(src, dtype)
    check_fits(src, c, device)
    how = f"loading {', '.join(src.weight_files)}" if src.weight_files else "building it with random weights"
    progress(f"{src.model_type} model from {src.folder}, {c.parameters:,} parameters: {how} ({dtype}, {device})")
    model = build(src, device, dtype)
    counted = models.count_model(model)
    return model, {"model": counted.as_record(), "model_source": src.record(model, counted)}


def _key(k) -> str:
    """A weight of a loading report: its name, or (mismatched) its name with both shapes."""
    if isinstance(k, tuple) and len(k) == 3:
        name, found, wanted = k
        return (
            f"{name} ({' x '.join(map(str, found))} in the file, {' x '.join(map(str, wanted))} by the configuration)"
        )
    return str(k)


def build(source: ModelSource, device: str, dtype: str):
    """The model of `source` on `device` in `dtype`: its weights loaded from the folder when it
    has them (every weight of the model found there with its shape, none left over: else a
    SourceError), else random weights."""
    if not source.weight_files:
        return _from_config(source, device, dtype)
    import torch
    from transformers import AutoModelForCausalLM

    try:
        with _offline():
            model, info = AutoModelForCausalLM.from_pretrained(
                source.folder,
                config=source.config,
                dtype=torch_dtype(dtype),
                local_files_only=True,
                use_safetensors=True,
                output_loading_info=True,
                ignore_mismatched_sizes=True,  # reported in `info`, refused below by the weight's name
            )
    except Exception as e:  # noqa: BLE001 (a size mismatch, an unreadable file: said in one line)
        raise SourceError(f"{source.folder}: its weights do not load into its configuration ({_why(e)})") from None
    for what in ("missing_keys", "mismatched_keys", "unexpected_keys"):
        keys = sorted(_key(k) for k in info.get(what) or ())
        if keys:
            more = f" and {len(keys) - 1} more" if len(keys) > 1 else ""
            said = what.replace("_keys", "").replace("mismatched", "of another shape")
            raise SourceError(
                f"{source.folder}: its weights do not match its configuration: {keys[0]}{more} {said} in "
                f"{', '.join(source.weight_files)}"
            )
    with torch.no_grad():
        return model.to(device).eval()
