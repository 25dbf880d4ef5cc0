"""Thin adapters for the trainers users train in: each derives the step from the trainer
(precision, clipping, optimizer, accumulation) so the step measured is the step that trains.
Each is imported on its own (``batchfit.integrations.lightning``, ``...transformers``) and needs
its extra (``pip install 'batchfit[lightning]'``); the core never imports them."""
