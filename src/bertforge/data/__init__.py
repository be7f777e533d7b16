"""Pretraining and fine-tuning data: corpora (``corpus``, ``tables``; Parquet, Arrow and
``datasets`` folders: ``columnar``) -> NSP pairs or packed
sequences (``instances``) -> token shards on disk (``shards``, ``dataset``); the masking
(``masking``) and batching (``loader``) of pretraining; labelled tasks for fine-tuning:
labels (``labels``), labelled files and the fine-tuning data set (``labelled``), tokenized
examples and their batches (``encoding``)."""

from bertforge.data.corpus import iter_documents, read_documents
from bertforge.data.dataset import PretrainingDataset, read_meta
from bertforge.data.labelled import LabelledData, TaskData, load_labelled, load_task_data
from bertforge.data.loader import (
    PretrainingCollator,
    PretrainingLoader,
    PretrainingSampler,
    validation_batches,
)
from bertforge.data.masking import mask_tokens
from bertforge.data.shards import PrepareConfig, format_summary, prepare
from bertforge.data.tables import iter_texts

__all__ = [
    "LabelledData",
    "PretrainingCollator",
    "PretrainingDataset",
    "PretrainingLoader",
    "PrepareConfig",
    "PretrainingSampler",
    "TaskData",
    "format_summary",
    "iter_documents",
    "iter_texts",
    "load_labelled",
    "load_task_data",
    "mask_tokens",
    "prepare",
    "read_documents",
    "read_meta",
    "validation_batches",
]
