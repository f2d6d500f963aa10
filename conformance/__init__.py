"""The conformance suite: every check touches only the protocol of SPEC section 6.

Run it against any implementation, this repository's or your own::

    pytest --pyargs cvae_rosetta.conformance --impl pure_jax
    pytest --pyargs cvae_rosetta.conformance --impl mypackage.mymodule:implementation
    CVAE_IMPL=flax_nnx,haiku pytest --pyargs cvae_rosetta.conformance
"""
