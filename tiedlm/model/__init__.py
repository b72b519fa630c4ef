"""The model: tiedlm's own blocks and any transformers causal LM, under one tie layer.

    model/tie.py           the tie between E and W_out as one value (its modes, labels, stored keys)
    model/arch.py          the block family as one value: its keys, sizes and initialisation
    model/tie_layer.py     every tying mode over any model's input embedding and output head
    blocks.py        tiedlm's own decoder blocks, GPT-2-style and Llama-style
    hf_config.py     model.arch: hf: a transformers configuration from the config's keys; the files a run
                     starts from, known by their content (start_identity) and kept in the run (start_files)
    model/hf_model.py      model.arch: hf: a transformers causal LM under the tie layer
    model/norms.py, model/loss.py   LayerNorm with a thread-count-free backward; the fused cross-entropy
    model/counting.py      parameter counts, memory and FLOPs per token of a config
    model/pretrained.py    model.init_from: starting from a saved model
    params_report.py `tiedlm params`: the counts of a config, tied and untied side by side
    model/memory_plan.py   `tiedlm train --dry-run`: memory per process and FLOPs, on the meta device

This file imports nothing: config/ reads model/tie.py, model/arch.py and model/pretrained.py without torch.
"""
