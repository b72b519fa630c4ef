"""Where a run is recorded besides its own folder (`train.log_to`): each tracker a view of
metrics.jsonl and report.json, written as the run trains. W&B, MLflow and Trackio are each an
optional extra; metrics.jsonl and report.json stay the record.

    trackers/tensorboard.py   TensorBoard event files in <run>/tb/
    trackers/base.py          what every tracker shares: the install check, what a run logs about
                              itself, the run folder's trackers.json (each tracker's run id and the
                              last step it holds)
    trackers/live.py          a run's trackers while it trains (guarded: a failure is said once,
                              training goes on), and a comparison's summary run
    trackers/summary.py       what a comparison's summary run holds
    trackers/wandb.py         Weights & Biases' client calls
    trackers/mlflow.py        MLflow's client calls
    trackers/trackio.py       Trackio's client calls
"""
