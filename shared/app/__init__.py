"""The application: data, training, checkpoints, evaluation, inference, export, serving, pictures
and the run directory. Implementations are reached only through the loader of
``cvae_rosetta.spec.protocol`` (:func:`cvae_rosetta.app.frameworks.load`, which also says what
installs a missing framework).
"""
