"""An experiment's settings: the config file, its schema and defaults, the checks that ask every part
whether it accepts them (the dry run), each stage's spec derived from them, and the settings record
under results/<name>/. It sits just under the stages because its checks read the parts' own readers.
Layer 7 (see margrpo/__init__.py): it must not import stages, plan, cli.
"""
