"""Where a run is recorded besides its own folder (`train.log_to`): each tracker a view of
metrics.jsonl and report.json, written as the run trains.

    trackers/tensorboard.py   TensorBoard event files in <run>/tb/
"""
