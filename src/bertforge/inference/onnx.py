"""ONNX: export a model (``bertforge export --format onnx``) and run it with ONNX Runtime.

:func:`export_onnx` writes ``model.onnx`` with dynamic batch and length axes beside the model's
``config.json``, its tokenizer, (for a fine-tuned model) its fine-tuning config and (for a
sentence-transformers model) its pooling declaration (``modules.json``, ``1_Pooling/``), so the
directory is a complete inference model: ``bertforge classify --model DIR --backend onnx``, and
``embed --backend onnx`` pools and normalises as ``embed`` on the eager model does.
``quantize="int8"`` adds ONNX Runtime's dynamic quantization of the weights of every MatMul (the
Linear layers: int8 weights with a scale per output column, activations quantized per batch at
run time); the embedding tables and LayerNorms stay float32.

``fuse=True`` (``bertforge export --fuse true``) rewrites the graph with ONNX Runtime's transformer
optimizer (``onnxruntime.transformers``, ``model_type="bert"``) before any quantization: each
layer's attention becomes one ``Attention`` operator (q, k and v from one GEMM; with int8 one
quantized ``QAttention``), bias + GELU one ``BiasGelu``, residual + LayerNorm
``SkipLayerNormalization``. These are ONNX Runtime's own (``com.microsoft``) operators, and on the
2-core AVX2 AMD EPYC of ``benchmarks/bench_onnx.py`` they were no reliable gain (from -20% to +12%
by model, batch size and precision, within that machine's run-to-run spread at batch 32), so the
default keeps standard ONNX operators, which any ONNX runtime runs. The fused attention reads
the 0/1 ``attention_mask`` as it is, so padding may sit anywhere, as in the standard graph.

What is exported is the plain computation (:class:`PlainBert`): the model's own parameters
through embeddings, attention with an additive padding mask, feed-forward and post-LN, without
the speed paths of ``bertforge.modeling.model`` (in-place buffers, skipping the padding, C
kernels), which serve eager PyTorch and would bake one batch's shapes into a traced graph.
``tests/test_onnx.py`` checks that ONNX Runtime's outputs equal the eager model's. A ModernBERT
exports as :class:`PlainModernBert`: its padded-grid computation (the one ``torch.compile``
runs), local layers through a (T, T) band mask, ``input_ids`` and ``attention_mask`` its only
inputs (``tests/test_modernbert.py`` checks it against the eager model).

:class:`OnnxModel` is the inference-level interface: it loads such a directory into an
``onnxruntime.InferenceSession`` and offers ``sequence_logits`` and ``hidden_states`` on padded
numpy batches (``token_logits`` for a token classifier); :func:`bertforge.inference.predict.classify`,
``embed`` and :func:`bertforge.inference.tagging.tag` take it in place of a PyTorch model. ``onnx`` and ``onnxruntime`` are an optional extra: ``pip install "bertforge[onnx]"``.
"""

from __future__ import annotations

import logging
import math
import shutil
import warnings
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bertforge.errors import BertforgeError
from bertforge.io import atomic_directory, write_manifest
from bertforge.modeling.auto import is_modern
from bertforge.modeling.checkpoint import (
    FINETUNE_CONFIG,
    ONNX_EXPORT_FILE,
    check_model_directory,
    check_tokenizer_fits,
    normalize_key,
    read_safetensors,
)
from bertforge.modeling.config import AnyConfig, BertConfig, ModernBertConfig, load_config
from bertforge.modeling.model import (
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
)
from bertforge.modeling.modernbert import (
    ModernBertForQuestionAnswering,
    ModernBertForSequenceClassification,
    ModernBertForTokenClassification,
    ModernBertModel,
    rotary_tables,
    rotate,
)
from bertforge.modeling.ops import activation
from bertforge.modeling.pooling import copy_pooling_declaration, pooling_declaration
from bertforge.tokenizer.wordpiece import Tokenizer

ONNX_FILE = ONNX_EXPORT_FILE
"""File name of the exported graph inside an export directory."""
Quantization = Literal["int8"]
QUANTIZATIONS: tuple[str, ...] = get_args(Quantization)
OPSET = 17
"""ONNX opset of the export (LayerNormalization is an operator from 17 on)."""
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
_BY_TOKEN = (*INPUT_NAMES, "last_hidden_state", "start_logits", "end_logits")
_ACTIVATIONS = {"gelu": "none", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh"}


def _require(module: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise BertforgeError(
            f"the ONNX backend needs the {module} package; install it with "
            '`pip install "bertforge[onnx]"`'
        ) from None


# ---- the exported computation -----------------------------------------------------------------
class PlainBert(nn.Module):
    """The encoder (+ pooler and classifier of a sequence classifier, the per-token classifier of
    a token classifier, or the span scorer of a question-answering model) as one straight-line
    graph over the parameters of a loaded bertforge model; ``forward`` returns the outputs named
    in :attr:`output_names`."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.bert = getattr(model, "bert", model)
        self.classifier = getattr(model, "classifier", None)
        self.qa_outputs = getattr(model, "qa_outputs", None)
        self.config: BertConfig = self.bert.config
        self.per_token = isinstance(model, BertForTokenClassification)
        """The logits are (B, T, num_labels), one row per token."""
        if self.classifier is not None and self.bert.pooler is None and not self.per_token:
            raise BertforgeError("a classifier without a pooler cannot be exported")
        self.output_names = ["last_hidden_state"]
        if self.bert.pooler is not None:
            self.output_names.append("pooler_output")
        if self.classifier is not None:
            self.output_names.insert(0, "logits")
        if self.qa_outputs is not None:
            self.output_names[:0] = ["start_logits", "end_logits"]

    def _activation(self, x: Tensor) -> Tensor:
        name = self.config.hidden_act
        return F.relu(x) if name == "relu" else F.gelu(x, approximate=_ACTIVATIONS[name])

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor
    ) -> tuple[Tensor, ...]:
        B, T = input_ids.shape
        nh, hs = self.config.num_attention_heads, self.config.head_dim
        emb = self.bert.embeddings
        positions = torch.arange(T, device=input_ids.device)
        x = (
            emb.word_embeddings(input_ids)
            + emb.position_embeddings(positions)
            + emb.token_type_embeddings(token_type_ids)
        )  # (B, T, H)
        x = emb.LayerNorm(x)
        # 0 at real tokens, a large negative number at padding: softmax gives padding ~0 weight
        keep = attention_mask[:, None, None, :].to(x.dtype)  # (B, 1, 1, T)
        bias = (1.0 - keep) * torch.finfo(x.dtype).min
        for layer in self.bert.encoder.layer:
            heads = layer.attention.self
            q = heads.query(x).view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
            k = heads.key(x).view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
            v = heads.value(x).view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
            scores = q @ k.transpose(-1, -2) / math.sqrt(hs) + bias  # (B, nh, T, T)
            y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, nh * hs)  # (B, T, H)
            out = layer.attention.output
            x = out.LayerNorm(out.dense(y) + x)
            h = self._activation(layer.intermediate.dense(x))  # (B, T, intermediate)
            x = layer.output.LayerNorm(layer.output.dense(h) + x)
        outputs = [x]
        if self.per_token:
            outputs.insert(0, self.classifier(x))  # (B, T, num_labels)
        if self.qa_outputs is not None:
            spans = self.qa_outputs(x)  # (B, T, 2)
            outputs[:0] = [spans[..., 0], spans[..., 1]]  # (B, T) each
        if self.bert.pooler is not None:
            pooled = torch.tanh(self.bert.pooler.dense(x[:, 0]))  # (B, H)
            outputs.append(pooled)
            if self.classifier is not None:
                outputs.insert(0, self.classifier(pooled))  # (B, num_labels)
        return tuple(outputs)


class PlainModernBert(nn.Module):
    """A ModernBERT (encoder, + the pooled head and classifier of a sequence classifier, the
    per-token head and classifier of a token classifier, or the span scorer of a
    question-answering model) as one straight-line graph over the padded (B, T) grid: the
    computation ``bertforge.modeling.modernbert`` runs under ``torch.compile`` (no unpadding, no
    blocks of the window), with the window of a local layer as a (T, T) band mask built from
    the length, so any length runs. ``token_type_ids`` is taken and ignored (ModernBERT has no
    segments; ONNX Runtime is fed only the inputs the graph keeps). The last hidden state is
    zero at padding, as the eager model's."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.encoder = getattr(model, "model", model)
        self.config = self.encoder.config
        self.head = getattr(model, "head", None)
        self.classifier = getattr(model, "classifier", None)
        self.per_token = isinstance(model, ModernBertForTokenClassification)
        self.spans = isinstance(model, ModernBertForQuestionAnswering)
        self.output_names = ["last_hidden_state"]
        if self.spans:
            self.output_names[:0] = ["start_logits", "end_logits"]
        elif self.classifier is not None:
            self.output_names.insert(0, "logits")

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor
    ) -> tuple[Tensor, ...]:
        B, T = input_ids.shape
        c = self.config
        nh, hs = c.num_attention_heads, c.head_dim
        enc = self.encoder
        x = enc.embeddings.norm(enc.embeddings.tok_embeddings(input_ids))  # (B, T, H)
        positions = torch.arange(T, device=input_ids.device)
        ropes = {}
        for kind in set(c.layer_types):
            theta = c.rope_parameters[kind]["rope_theta"]
            ropes[kind] = rotary_tables(positions, hs, theta)  # (T, hs) each
        keys = attention_mask[:, None, None, :].bool()  # (B, 1, 1, T)
        i = positions
        band = (i[:, None] - i[None, :]).abs() <= c.window  # (T, T)
        allowed = {"full_attention": keys, "sliding_attention": keys & band[None, None]}
        for layer in enc.layers:
            h = layer.attn_norm(x)
            qkv = layer.attn.Wqkv(h).view(B, T, 3, nh, hs).permute(2, 0, 3, 1, 4)
            q, k, v = qkv.unbind(0)  # (B, nh, T, hs)
            cos, sin = ropes[layer.attention_type]
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
            scores = q @ k.transpose(-1, -2) / math.sqrt(hs)  # (B, nh, T, T)
            mask = allowed[layer.attention_type]
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
            y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, nh * hs)  # (B, T, H)
            x = x + layer.attn.Wo(y)
            a, g = layer.mlp.Wi(layer.mlp_norm(x)).chunk(2, dim=-1)
            x = x + layer.mlp.Wo(activation(layer.mlp.act, a) * g)
        keep = attention_mask[:, :, None].to(x.dtype)  # (B, T, 1)
        x = enc.final_norm(x) * keep  # zero at padding, as the eager model's
        outputs = [x]
        if self.spans:
            spans = self.classifier(self.head(x))  # (B, T, 2)
            outputs[:0] = [spans[..., 0], spans[..., 1]]
        elif self.per_token:
            outputs.insert(0, self.classifier(self.head(x)))  # (B, T, num_labels)
        elif self.classifier is not None:
            if c.classifier_pooling == "cls":
                pooled = x[:, 0]  # (B, H)
            else:
                pooled = x.sum(1) / keep.sum(1).clamp(min=1.0)  # the real tokens' mean
            outputs.insert(0, self.classifier(self.head(pooled)))  # (B, num_labels)
        return tuple(outputs)


# ---- export -----------------------------------------------------------------------------------
def _load_for_export(model_dir: Path) -> nn.Module:
    """The richest model the checkpoint holds: a token classifier (by its declared architecture),
    a question-answering model when it has ``qa_outputs`` weights, a sequence classifier when it
    has classifier weights, else the encoder (with its pooler when the checkpoint has one)."""
    keys = {normalize_key(k) for k in read_safetensors(model_dir)}
    config = load_config(model_dir / "config.json")
    if isinstance(config, ModernBertConfig):
        return _load_modern_for_export(model_dir, config, keys)
    if "BertForTokenClassification" in (config.architectures or []):
        return BertForTokenClassification.from_pretrained(model_dir).eval()
    if any(k.startswith("qa_outputs.") for k in keys):
        return BertForQuestionAnswering.from_pretrained(model_dir).eval()
    if any(k.startswith("classifier.") for k in keys):
        return BertForSequenceClassification.from_pretrained(model_dir).eval()
    model = BertModel.from_pretrained(model_dir)
    if any(k.startswith("pooler.") for k in model.loading_info["missing"]):
        model.pooler = None  # not in the checkpoint: export no (random) pooler output
    return model.eval()


def _load_modern_for_export(model_dir: Path, config: ModernBertConfig, keys: set[str]) -> nn.Module:
    """:func:`_load_for_export` of a ModernBERT: its token classifier or question-answering model
    (as ``architectures`` declares: their heads have the names of a sequence classifier's), its
    sequence classifier (classifier weights), else its encoder (a masked LM's too)."""
    architectures = config.architectures or []
    for cls in (ModernBertForTokenClassification, ModernBertForQuestionAnswering):
        if cls.__name__ in architectures:
            return cls.from_pretrained(model_dir).eval()
    if any(k.startswith("classifier.") for k in keys):
        return ModernBertForSequenceClassification.from_pretrained(model_dir).eval()
    return ModernBertModel.from_pretrained(model_dir).eval()


def _sample_inputs(config: AnyConfig) -> tuple[Tensor, Tensor, Tensor]:
    """A (2, 8) batch with padding in its second row (any shapes: the axes are dynamic)."""
    ids = torch.randint(5, config.vocab_size, (2, 8))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    return ids, mask, torch.zeros_like(ids)


def fuse_graph(path: Path, config: BertConfig) -> dict[str, int]:
    """Rewrite the exported graph at ``path`` in place with ONNX Runtime's BERT fusions (see the
    module docstring); returns how many operators of each fused kind it now has."""
    optimizer = _require("onnxruntime.transformers.optimizer")
    fusion = _require("onnxruntime.transformers.fusion_options")
    options = fusion.FusionOptions("bert")
    # the raw (B, T) 0/1 mask, not ONNX Runtime's default of lengths derived from it, which
    # would be right only for right padding
    options.attention_mask_format = fusion.AttentionMaskFormat.AttentionMask
    model = optimizer.optimize_model(
        str(path),
        model_type="bert",
        num_heads=config.num_attention_heads,
        hidden_size=config.hidden_size,
        optimization_options=options,
        opt_level=0,  # the fusions only: the session applies its own optimizations on loading
    )
    model.save_model_to_file(str(path))
    return {k: v for k, v in model.get_fused_operator_statistics().items() if v}


def quantize_int8(source: Path, target: Path) -> None:
    """``bertforge export --quantize int8``: ONNX Runtime's dynamic quantization of the graph at
    ``source`` (standard or fused) into ``target`` (see the module docstring)."""
    quantization = _require("onnxruntime.quantization")
    # the quantizer logs "Please consider to run pre-processing before quantization" on the root
    # logger for every model: the export is already shape-complete (and measured as it is)
    advice = _DropMessage("pre-processing before quantization")
    logging.getLogger().addFilter(advice)
    try:
        quantization.quantize_dynamic(
            str(source),
            str(target),
            op_types_to_quantize=["MatMul", "Attention"],
            weight_type=quantization.QuantType.QInt8,
            # a scale per output column, not one per matrix: the IMDB classifier of
            # benchmarks/bench_onnx.py lost 2.8 points with one scale, 0.2 with per-channel
            per_channel=True,
            # ONNX Runtime's fused operators carry no output types for the quantizer
            extra_options={"DefaultTensorType": 1},  # float
        )
    finally:
        logging.getLogger().removeFilter(advice)


class _DropMessage(logging.Filter):
    """A logging filter that drops the records whose message contains ``text``."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


def export_onnx(
    model_dir: str | Path,
    output: str | Path,
    *,
    quantize: str | None = None,
    fuse: bool = False,
) -> dict[str, Any]:
    """Export the model in ``model_dir`` to ``output/model.onnx`` (see the module docstring);
    copies config, tokenizer, fine-tuning config and pooling declaration (:func:`pooling_declaration`)
    beside it. Returns a summary dict."""
    check_model_directory(model_dir)  # as given: Path() would drop the "./" that says "local"
    model_dir, output = Path(model_dir), Path(output)
    if quantize is not None and quantize not in QUANTIZATIONS:
        raise BertforgeError(f"--quantize {quantize!r}: choose int8 (or leave it out for fp32)")
    if not (model_dir / "config.json").is_file():
        raise BertforgeError(f"{model_dir}: no config.json; point --model at a model directory")
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise BertforgeError(f"{output}: already exists and is not empty; choose another --output")
    _require("onnx")
    model = _load_for_export(model_dir)
    tokenizer = Tokenizer.from_file(model_dir)
    check_tokenizer_fits(tokenizer, model.config, model_dir)
    modern = is_modern(model)
    if modern and fuse:
        raise BertforgeError(
            f"{model_dir}: --fuse true rewrites BERT graphs (ONNX Runtime's model_type bert); "
            "a ModernBERT exports with standard operators only: leave --fuse out"
        )
    plain = (PlainModernBert(model) if modern else PlainBert(model)).eval()
    with atomic_directory(output) as tmp:
        fp32 = tmp / (ONNX_FILE if quantize is None else "model-fp32.onnx")
        # The TorchScript exporter (dynamo=False): it traces this straight-line graph in seconds
        # into one self-contained file and needs no onnxscript; the torch.export-based one took
        # 6x longer on MiniLM and writes the weights to a separate .data file. Its deprecation
        # warning is not the user's business.
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            torch.onnx.export(
                plain,
                _sample_inputs(plain.config),
                str(fp32),
                input_names=list(INPUT_NAMES),
                output_names=plain.output_names,
                dynamic_axes={
                    name: {0: "batch", 1: "length"}
                    if name in _BY_TOKEN or (name == "logits" and plain.per_token)
                    else {0: "batch"}
                    for name in (*INPUT_NAMES, *plain.output_names)
                },
                opset_version=OPSET,
                dynamo=False,
            )
        fused = fuse_graph(fp32, plain.config) if fuse else {}
        if quantize == "int8":
            quantize_int8(fp32, tmp / ONNX_FILE)
            fp32.unlink()
        model.config.save(tmp)
        tokenizer.save(tmp)
        if (model_dir / FINETUNE_CONFIG).is_file():  # classify's defaults (columns, max_length)
            shutil.copy2(model_dir / FINETUNE_CONFIG, tmp / FINETUNE_CONFIG)
        declaration = copy_pooling_declaration(model_dir, tmp)  # embed's pooling, normalising
        write_manifest(tmp)  # last: what bertforge verify checks the export against
    size = (output / ONNX_FILE).stat().st_size
    return {
        "output": str(output / ONNX_FILE),
        "outputs": plain.output_names,
        "quantize": quantize or "none (fp32)",
        "fused": fused,  # {} for standard ONNX operators
        "pooling": declaration,  # [] without a sentence-transformers pooling declaration
        "megabytes": round(size / 2**20, 1),
    }


# ---- running ----------------------------------------------------------------------------------
class OnnxModel:
    """An exported directory loaded into ONNX Runtime (CPU): what the ``onnx`` backend runs.

    ``config`` is the model's :class:`BertConfig` or ``ModernBertConfig`` (labels, positions, hidden size);
    :meth:`sequence_logits` and :meth:`hidden_states` take padded int64 numpy batches.
    """

    def __init__(self, directory: str | Path, threads: int | None = None) -> None:
        ort = _require("onnxruntime")
        directory = Path(directory)
        path = directory / ONNX_FILE
        if not path.is_file():
            raise BertforgeError(
                f"{directory}: no {ONNX_FILE}; export the model first "
                f"(bertforge export --model MODEL --format onnx --output {directory})"
            )
        self.directory = directory
        # as a PyTorch model's: inference reads the settings saved beside the weights from here
        # (finetune_config.json, the pooling declaration)
        self.name_or_path = str(directory)
        self.config = load_config(directory / "config.json")
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if threads:
            options.intra_op_num_threads = threads
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.input_names = [i.name for i in self.session.get_inputs()]
        """What the graph takes: a ModernBERT's export keeps no ``token_type_ids``."""

    def _feed(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {k: np.ascontiguousarray(batch[k], dtype=np.int64) for k in self.input_names}

    def parameter_count(self) -> int:
        """Number of weights in the graph (its initializers; int8 weights count once each)."""
        onnx = _require("onnx")
        graph = onnx.load(str(self.directory / ONNX_FILE), load_external_data=False).graph
        return sum(int(np.prod(t.dims)) for t in graph.initializer if len(t.dims) >= 1)

    def _run(self, name: str, batch: dict[str, np.ndarray]) -> np.ndarray:
        if name not in self.output_names:
            raise BertforgeError(
                f"{self.directory / ONNX_FILE} has no {name!r} output (it has "
                f"{', '.join(self.output_names)}); export a model that has one"
            )
        return self.session.run([name], self._feed(batch))[0]

    def sequence_logits(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        """(B, num_labels) float32 logits of a padded batch of a sequence classifier."""
        return self._run("logits", batch)

    def token_logits(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        """(B, T, num_labels) float32 logits of a padded batch of a token classifier."""
        return self._run("logits", batch)

    def span_logits(self, batch: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """(B, T) float32 start and end logits of a padded batch of a question-answering model."""
        if "start_logits" not in self.output_names:
            raise BertforgeError(
                f"{self.directory / ONNX_FILE} has no start_logits output (it has "
                f"{', '.join(self.output_names)}); export a question-answering model"
            )
        start, end = self.session.run(["start_logits", "end_logits"], self._feed(batch))
        return start, end

    def hidden_states(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        """(B, T, H) float32 last hidden states of a padded batch."""
        return self._run("last_hidden_state", batch)


def load_onnx(directory: str | Path, threads: int | None = None) -> OnnxModel:
    """:class:`OnnxModel` of an export directory (``model.onnx`` + config + tokenizer)."""
    return OnnxModel(directory, threads)


__all__ = [
    "ONNX_FILE",
    "OPSET",
    "QUANTIZATIONS",
    "Quantization",
    "OnnxModel",
    "PlainBert",
    "PlainModernBert",
    "export_onnx",
    "fuse_graph",
    "quantize_int8",
    "load_onnx",
    "pooling_declaration",
]
