"""The ``bertforge`` subcommands, one module each: argument parsing, loading what the command
needs and printing its results. The work itself is done by the library modules of the same name
(``bertforge.tokenizer``, ``evaluate``, ``predict``, ``finetune``, ``pretrain``), which never
parse arguments, so a script or a web page can call them directly.
"""
