"""A user's script that builds its own transformers.Trainer (a tiny regression on random data), as such scripts
are run under torchrun. The main process writes OUT/trainer.json: world size, steps, final loss."""

import json
import os
import sys

import torch
from torch import nn
from transformers import Trainer, TrainingArguments


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 1)

    def forward(self, x, labels=None):  # type: ignore[no-untyped-def]
        prediction = self.linear(x).squeeze(-1)
        return {"loss": nn.functional.mse_loss(prediction, labels), "logits": prediction}


class Data(torch.utils.data.Dataset):
    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(64, 4, generator=generator)
        self.y = self.x.sum(dim=1)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> dict:  # type: ignore[type-arg]
        return {"x": self.x[index], "labels": self.y[index]}


def main() -> None:
    out = sys.argv[1]
    arguments = TrainingArguments(output_dir=os.path.join(out, "trainer"), max_steps=8, per_device_train_batch_size=4,
                                  use_cpu=True, report_to=[], save_strategy="no", logging_steps=4,
                                  ddp_backend="gloo", dataloader_num_workers=0)
    trainer = Trainer(model=Tiny(), args=arguments, train_dataset=Data())
    result = trainer.train()
    if trainer.is_world_process_zero():
        with open(os.path.join(out, "trainer.json"), "w") as sink:
            json.dump({"world_size": arguments.world_size, "steps": result.global_step,
                       "loss": result.training_loss}, sink)


if __name__ == "__main__":
    main()
