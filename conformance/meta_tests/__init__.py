"""The suite tests itself: deliberately broken implementations, each of which it must fail.

``broken`` defines them (each a small, plausible porting bug on top of ``impls/pure_jax.py``),
``runner`` runs the conformance suite on one of them in a subprocess and reads its JUnit XML
(``no_shrink`` is a plugin for those runs: no hypothesis shrinking), ``test_meta.py`` asserts that
every broken implementation fails and the reference passes, and ``report`` writes the table of
which checks catch which bug (``docs/meta_tests.md``).

These tests are not collected by ``pytest --pyargs conformance`` (the plugin ignores this folder
unless a path inside it is given); run them explicitly::

    pytest conformance/meta_tests
    python -m conformance.meta_tests.report --out docs/meta_tests.md
"""
