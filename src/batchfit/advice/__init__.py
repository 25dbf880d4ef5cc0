"""The whole checklist on the user's model (``advise``): the verb and its answer (``Advice``). What to
change, ranked by measured gain, is ``policy.explore.advice``."""
