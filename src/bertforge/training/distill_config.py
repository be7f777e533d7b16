"""``DistillConfig``: everything ``bertforge distill`` needs (docs/distillation.md), validated once
with messages that say how to fix a value; written resolved to OUTPUT/distill_config.json.

The task, labels, text columns, pooling and maximum length come from the teacher's directory
(its ``config.json``, ``finetune_config.json`` and sentence-transformers declaration), so that a
user names only the files; the options here are the student, the data and the loss.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from bertforge.data.corpus import EncodingErrors
from bertforge.errors import BertforgeError
from bertforge.modeling.checkpoint import resolve_model
from bertforge.training.config import (
    Architecture,
    LoopOptions,
    Preset,
    check_at_least,
    check_choice,
    check_training_options,
)

DISTILL_CONFIG = "distill_config.json"
"""The file a distillation run writes first into OUTPUT (what marks the directory as one)."""

TransferUnit = Literal["auto", "document", "sentence"]
"""What one text of an ``--unlabelled`` corpus is."""

SaveDtype = Literal["auto", "fp32", "bf16", "fp16"]
"""The floating-point type of the student's saved weights."""


def option(name: str) -> str:
    """How ``bertforge distill`` spells a ``DistillConfig`` field on the command line."""
    return "--" + name


@dataclass
class DistillConfig(LoopOptions):
    """Everything ``bertforge distill`` needs; written resolved to OUTPUT/distill_config.json."""

    teacher: str
    """The fine-tuned teacher: a directory ``bertforge finetune`` wrote (classification or
    regression, single texts or pairs; token classification; question answering), any BERT
    sequence or token classifier or span scorer, or a sentence-transformers
    embedding model (all-MiniLM-L6-v2 names the installed copy of that published model)."""
    output: str
    """Output directory for the distilled student, metrics, plots and checkpoints."""
    student: str | None = None
    """The student's start: any BERT or ModernBERT directory (its own tokenizer; a pretraining
    head is dropped, another task's head refused). Give exactly one of --student, --student_layers and
    --student_preset."""
    student_layers: list[int] | None = None
    """Start the student as a copy of these teacher layers (0-based, increasing, e.g. 0 2 4),
    with the teacher's embeddings, pooler, head and tokenizer (DistilBERT's initialisation,
    sentence-transformers' layer reduction)."""
    student_preset: Preset | None = None
    """Start the student with fresh weights in one of Google's BERT sizes (tiny: 2 x 128 ...
    large), or with --student_architecture modernbert a ModernBERT size (tiny, mini,
    ettin-17m, base), with the teacher's tokenizer."""
    student_architecture: Architecture | None = None
    """With --student_preset: the fresh student's architecture, bert or modernbert (default:
    the teacher's)."""
    student_num_layers: int | None = None
    """With --student_preset: the fresh student's layer count instead of the preset's (a depth
    of your own choosing, e.g. --student_preset tiny --student_num_layers 3)."""
    student_hidden_size: int | None = None
    """With --student_preset: the fresh student's width instead of the preset's, with
    width/64 attention heads (at least 1) and a 4 x width feed-forward, as Google's sizes
    (e.g. --student_preset tiny --student_hidden_size 256: 2 x 256)."""
    train: list[str] | None = None
    """Labelled training file(s) in the teacher's columns (as for ``finetune``; a token
    classifier's: CoNLL-style or tokens/tags JSONL; a QA teacher's: SQuAD JSON or JSONL): gold labels beside the teacher's; an
    embedding teacher reads the texts of its text columns."""
    unlabelled: list[str] | None = None
    """Transfer text the teacher labels, no gold labels needed: files, directories or globs in
    any corpus format ``prepare`` reads (text, lines, wikitext, csv/tsv/jsonl with the teacher's
    text column), optionally compressed. A pair teacher's are tables (csv/tsv/jsonl, Parquet)
    of pairs in its two text columns, no labels (benchmarks/silver_pairs.py makes such pairs
    from a task's own sentences). Alone (without --train) for an embedding teacher, or for a
    task teacher with --validation."""
    validation: list[str] | None = None
    """Labelled validation file(s) in the teacher's columns (embedding: texts, on which the
    student is scored by its cosine to the teacher's vectors); without them a share
    (--validation_fraction) of --train (embedding: of all the training texts) is held out."""
    validation_columns: list[str] | None = None
    """An embedding teacher's --validation read as pairs: the columns of the two texts and,
    for scored pairs, of their similarity (``sentence1 sentence2 label`` for GLUE's STS-B).
    The student is then also scored as ``benchmark --suite embedding`` scores: scored pairs
    by the Spearman and Pearson correlation of the cosine with the score, pairs by retrieval
    (MRR@10, nDCG@10, recall@1/10/100); the best student is picked by spearman (or mrr@10)
    unless --metric says otherwise."""
    validation_fraction: float = 0.1
    """Share of the training rows (embedding: texts) held out for validation without --validation."""
    transfer_unit: TransferUnit = "auto"
    """One text of an --unlabelled corpus: a document (a line of a ``lines`` file, a table
    row), or each of its sentences; auto: sentences for an embedding teacher, else documents."""
    max_unlabelled: int | None = None
    """Read at most this many transfer texts from --unlabelled (its first ones)."""
    balance_transfer: bool = False
    """A classification teacher with gold labels: keep the transfer texts (--unlabelled,
    --augment) in the gold labels' class proportions, each text's class the teacher's top one,
    by dropping at random the surplus of the classes the teacher gives more often. Transfer text
    from elsewhere (neighbour pairs, general text) can hold one class far more than the task
    does, and the student then learns that prior."""
    augment: str | None = None
    """TinyBERT's data augmentation: a model with a masked-LM head (a ``bertforge pretrain``
    output, any BERT or ModernBERT masked LM with a WordPiece vocabulary) whose predictions
    replace words of the labelled texts, making --augment_copies new texts of each that the
    teacher labels (classification and regression teachers; docs/distillation.md)."""
    augment_copies: int = 20
    """New texts per labelled text (TinyBERT: 20); variants equal to their text are dropped."""
    augment_rate: float = 0.4
    """Probability that each replaceable word of a new text is replaced (TinyBERT: 0.4)."""
    augment_candidates: int = 15
    """The augmenter's likeliest whole words a replaced word is drawn from (TinyBERT: 15)."""
    metric: str | None = None
    """Validation metric that picks the best student: for a classification teacher accuracy
    (default), macro_f1, mcc or agreement (with the teacher's predictions); regression spearman
    (default) or pearson; token classification entity_f1 (default) or agreement; question
    answering f1 (default) or exact_match; embedding cosine (to the teacher's vectors), or with
    --validation_columns spearman (default) or pearson for scored pairs, mrr@10 (default),
    ndcg@10, recall@1, recall@10 or recall@100 for pairs."""
    alpha: float = 0.5
    """Weight of the soft-target (teacher) term; the gold labels' term weighs 1 - alpha. A batch
    without gold labels (transfer text) trains on the soft term alone. 1: the teacher alone."""
    temperature: float = 2.0
    """Softmax temperature of the soft targets (classification); the term is scaled by T^2 so
    its gradient keeps its size (Hinton et al. 2015)."""
    cosine_weight: float = 0.0
    """embedding: weight of the in-batch cosine-matrix term beside the MSE to the teacher's
    vectors (0: MSE alone)."""
    hidden_weight: float = 0.0
    """Weight of TinyBERT's hidden-state loss: the MSE between each mapped pair of layers'
    outputs, the student's through a learned projection to the teacher's width (0: off). The
    intermediate losses run the teacher beside the student at every step and need its
    tokenizer (--student_layers, --student_preset or a student with the same vocabulary)."""
    attention_weight: float = 0.0
    """Weight of the attention-distribution KL of each mapped pair of layers (the same head
    count on both sides; else --relation_weight). 0: off."""
    relation_weight: float = 0.0
    """Weight of MiniLM-v2's self-attention relation KL (queries, keys and values, each split
    into --relation_heads on both sides: any head counts and widths). 0: off."""
    relation_heads: int | None = None
    """Relation heads of --relation_weight, dividing both models' widths; default the
    student's attention heads."""
    layer_map: list[int] | None = None
    """The teacher layer (0-based) each student layer learns from in the intermediate losses,
    one per student layer; default: the copied layers of --student_layers, else uniform with
    the last layers meeting (TinyBERT)."""
    max_length: int | None = None
    """Tokens per text including [CLS]/[SEP], for both models; default the teacher's
    fine-tuning length (finetune_config.json), else 128."""
    batch_size: int = 32
    """Texts per optimizer step."""
    micro_batch_size: int | None = None
    """Texts per forward pass, a divisor of --batch_size; the rest is gradient accumulation, each
    micro-batch's terms weighted by its share of the batch's units (rows, labelled rows, words,
    real tokens: what each term is a mean over), so the step's gradient is the whole batch's.
    None = the whole batch. Not with --cosine_weight (an in-batch matrix)."""
    eval_batch_size: int = 64
    """Texts per evaluation batch (and per teacher batch)."""
    lr: float = 1e-4
    """Peak learning rate (AdamW)."""
    warmup_ratio: float = 0.1
    """Fraction of training (steps or time) spent warming the LR up linearly from 0."""
    epochs: float = 3.0
    """Passes over the training and transfer texts; --max_steps overrides it."""
    max_steps: int | None = None
    """Train for this many optimizer steps (overrides --epochs; the LR schedule ends there)."""
    max_time: str | None = None
    """Wall-clock training budget such as 40m (evaluation and the teacher's pass not counted);
    0 or none: no limit."""
    dropout: float | None = None
    """The student's dropout rate while training; None keeps its config's."""
    eval_every: int = 0
    """Validate every N steps (0 = once per epoch), and always at the end."""
    seed: int = 0
    """Seed for a fresh student, the validation split, the data order and dropout."""
    encoding_errors: EncodingErrors = "strict"
    """strict: stop at bytes that are not UTF-8 (naming file and line); replace: read them as
    U+FFFD."""
    keep_checkpoints: int = 1
    """Resumable checkpoints (written at each evaluation and on SIGINT/SIGTERM) to keep."""
    keep_final_checkpoint: bool = False
    """Keep the resumable checkpoint and the teacher's cached outputs after a finished run."""
    teacher_cache: str | None = None
    """A ``.npy`` file for the teacher's outputs instead of OUTPUT/teacher_outputs.npy: read
    when it holds this teacher's outputs of these very texts (checked by a key beside it), else
    computed into it; kept after the run. Several students of one teacher on one data set
    then pay for the teacher's pass once."""
    save_dtype: SaveDtype = "auto"
    """The student's saved weights: auto stores them as the teacher's are stored (fp32 unless
    the teacher's model.safetensors is bf16 or fp16, so that a student is never wider on disk
    than its teacher), or fp32 / bf16 / fp16."""
    report: bool = False
    """Write OUTPUT/report.md and report.json at the end (docs/distillation.md, "The report"):
    the teacher, the student, each --report_compare model, the student's random twin
    (untrained) and the constant baseline on the same validation rows, with parameters, MB on
    disk and CPU texts/s at batch 1 and 32, eager and ONNX int8, measured in one interleaved
    run. On a finished run, the same command with --report true writes the report alone."""
    report_compare: list[str] | None = None
    """More model directories of the teacher's task for the report, scored on the same rows
    and timed alike: e.g. the student's start fine-tuned alone (bertforge finetune) on the
    same --train for the same steps."""
    report_alone: bool = False
    """Also train, for the report, the student's start and its random twin (its config, fresh
    weights) on the gold labels of --train alone (no teacher: --alpha 0, no --unlabelled, no
    intermediate losses) for the distillation's steps, into OUTPUT/report/alone and
    OUTPUT/report/twin: what distillation bought, measured."""
    report_texts: int = 256
    """Validation texts the report's throughput is measured on (the first ones)."""
    report_rounds: int = 3
    """Interleaved rounds of the report's throughput measurement (the best is kept)."""

    def __post_init__(self) -> None:
        self.teacher = resolve_model(self.teacher)
        if self.student is not None:
            self.student = resolve_model(self.student)
        starts = [self.student, self.student_layers, self.student_preset]
        if sum(s is not None for s in starts) != 1:
            raise BertforgeError(
                "give exactly one student: --student DIR, --student_layers 0 2 4 (a subset of "
                "the teacher's layers) or --student_preset tiny (fresh weights)"
            )
        shape = dict(
            student_num_layers=self.student_num_layers,
            student_hidden_size=self.student_hidden_size,
            student_architecture=self.student_architecture,
        )
        for name, value in shape.items():
            if value is None:
                continue
            if self.student_preset is None:
                raise BertforgeError(
                    f"--{name} shapes a fresh student: give it with --student_preset "
                    f"(e.g. --student_preset tiny --{name} {value})"
                )
            if isinstance(value, int) and value < 1:
                raise BertforgeError(f"--{name} {value} must be at least 1")
        layers = self.student_layers
        if layers is not None and (not layers or sorted(set(layers)) != list(layers)):
            raise BertforgeError(
                f"--student_layers {layers}: distinct teacher layers in increasing order, e.g. 0 2 4"
            )
        if not (self.train or self.unlabelled):
            raise BertforgeError(
                "give training text: --train FILE (labelled) and/or --unlabelled FILE "
                "(text the teacher labels)"
            )
        columns = self.validation_columns
        if columns is not None:
            if len(columns) not in (2, 3) or len(set(columns)) != len(columns):
                raise BertforgeError(
                    f"--validation_columns {' '.join(columns)}: name two text columns and "
                    "optionally a score column, all different, e.g. sentence1 sentence2 label"
                )
            if not self.validation:
                raise BertforgeError(
                    "--validation_columns names the columns of --validation: give the file "
                    "with --validation FILE"
                )
        check_choice(self.transfer_unit, TransferUnit, "--transfer_unit")
        check_choice(self.encoding_errors, EncodingErrors, "--encoding_errors")
        if self.augment is not None:
            self.augment = resolve_model(self.augment)
        check_at_least(self, option, augment_copies=1, augment_candidates=1)
        if not 0.0 < self.augment_rate <= 1.0:
            raise BertforgeError(
                f"--augment_rate {self.augment_rate} must lie in (0, 1] (TinyBERT used 0.4)"
            )
        if not 0.0 <= self.alpha <= 1.0:
            raise BertforgeError(f"--alpha {self.alpha} must lie in [0, 1] (1: the teacher alone)")
        if not (self.temperature > 0 and math.isfinite(self.temperature)):
            raise BertforgeError(f"--temperature {self.temperature} must be positive (2 is usual)")
        for name in ("cosine_weight", "hidden_weight", "attention_weight", "relation_weight"):
            if not getattr(self, name) >= 0:
                raise BertforgeError(f"{option(name)} {getattr(self, name)} must be 0 or more")
        check_at_least(self, option, relation_heads=1)
        if not 0.0 < self.validation_fraction < 1.0:
            raise BertforgeError(
                f"--validation_fraction {self.validation_fraction} must lie strictly between 0 and 1"
            )
        if self.batch_size <= 0 or self.eval_batch_size <= 0 or self.epochs <= 0:
            raise BertforgeError("--batch_size, --eval_batch_size and --epochs must be positive")
        check_training_options(self, option)
        check_at_least(self, option, micro_batch_size=1)
        if self.batch_size % self.micro_batch:
            raise BertforgeError(
                f"--micro_batch_size {self.micro_batch_size} does not divide --batch_size "
                f"{self.batch_size}; choose a divisor"
            )
        if self.cosine_weight and (self.micro_batch < self.batch_size or self.max_memory):
            raise BertforgeError(
                "--cosine_weight compares the whole batch's cosine matrices, which micro-batches "
                "cannot split; drop --micro_batch_size / --max_memory or set --cosine_weight 0"
            )
        check_at_least(self, option, max_steps=1, eval_every=0, keep_checkpoints=0)
        check_at_least(self, option, max_unlabelled=1, max_length=3)
        check_choice(self.save_dtype, SaveDtype, "--save_dtype")
        check_at_least(self, option, report_texts=1, report_rounds=1)
        for name in ("report_compare", "report_alone"):
            if getattr(self, name) and not self.report:
                raise BertforgeError(f"{option(name)} is for the report: add --report true")

    @property
    def micro_batch(self) -> int:
        """Texts per forward pass: --micro_batch_size, at most the batch."""
        return min(self.micro_batch_size or self.batch_size, self.batch_size)

    @property
    def intermediate(self) -> bool:
        """Whether any intermediate (layer) loss is on: the teacher then runs at every step."""
        return bool(self.hidden_weight or self.attention_weight or self.relation_weight)


__all__ = ["DISTILL_CONFIG", "DistillConfig", "SaveDtype", "TransferUnit", "option"]
