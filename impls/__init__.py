"""One module per framework, each computing the CVAE of the spec behind the common protocol."""
