"""The suite tests itself: deliberately broken implementations, each of which it must fail.

``broken`` defines them (each a small, plausible porting bug on top of ``impls/pure_jax.py``),
``runner`` runs the conformance suite on the reference and on all of them in one pytest session in
a subprocess (the ``recorder`` plugin makes that session one run per implementation and records
each; ``no_shrink``: no hypothesis shrinking), ``test_meta.py`` asserts that every broken
implementation fails and the reference passes, and ``report`` writes the table of which checks
catch which bug (``docs/meta_tests.md``).

These tests are not collected by ``pytest --pyargs cvae_rosetta.conformance`` (the plugin ignores
this folder unless it, or a path or module inside it, is named); run them explicitly::

    CVAE_META_FAST=1 pytest --pyargs cvae_rosetta.conformance.meta_tests    # what tox -e meta runs
    pytest --pyargs cvae_rosetta.conformance.meta_tests
    python -m cvae_rosetta.conformance.meta_tests.report --out docs/meta_tests.md
"""
