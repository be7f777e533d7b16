"""The tokenizer: train a WordPiece vocabulary on your text, or load a standard ``vocab.txt`` /
``tokenizer.json`` (``wordpiece``); the files a BERT tokenizer is stored in (``files``)."""

from bertforge.tokenizer.files import SPECIAL_TOKENS, read_vocab_txt, write_tokenizer_files
from bertforge.tokenizer.wordpiece import Tokenizer, TrainOptions

__all__ = ["SPECIAL_TOKENS", "Tokenizer", "TrainOptions", "read_vocab_txt", "write_tokenizer_files"]
