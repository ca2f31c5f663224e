"""The toy lab's trained pieces, built on ShapesWorld: the toy MAR's pre-training and head warm-up
(`pretraining`), and the learned toy rewards' training (`toyclip_training`: the CLIP analogue;
`toypref_training`: the HPS-like preference analogue). The world itself is `margrpo.world`.
Layer 5 (see margrpo/__init__.py): it must not import evaluation, reporting, experiment, stages, plan, cli.
"""
