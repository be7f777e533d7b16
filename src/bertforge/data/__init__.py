"""Pretraining and fine-tuning data: corpora, instances, shards, masking, labelled tasks."""
