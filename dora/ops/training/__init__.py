"""The trainer's parts, one role each: which rows a step takes (batch_choice), the loss step over
micro-batches and ranks (loss_step), its settings (update_settings), and its checkpoint I/O
(trainer_checkpoint). dora/ops/update.py is the op that drives them."""
