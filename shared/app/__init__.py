"""The application: data, training, checkpoints, evaluation, inference, export, serving, pictures
and the run directory. Implementations are reached only through ``cvae_rosetta.spec.protocol``.
"""
