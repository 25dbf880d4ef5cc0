"""Experiment configs' searches: loading a YAML config (``load_config``, its schema generated from the
options), the sizes written into it at the start of training (``apply_autobatch``), and the search
across memory fractions and modes outside training (``analyze``, ``Analysis``)."""
