"""Deduplication below the file: what two consecutive checkpoints share, by file and by tensor.

    .venv/bin/python bench/dedup_tensors.py                      # under a minute on 2 cores
    .venv/bin/python bench/dedup_tensors.py --keep /tmp/dedup    # keep the checkpoints

A small GPT (12 blocks, width 256, vocabulary 16,384, head tied to the embedding: GPT-2
small's proportions at a third of its width, 13.7 M fp32 parameters) is trained on CPU,
with AdamW, from a fixed seed. Each case saves twice, --steps optimizer steps apart:

  full        every parameter trained;
  frozen      fine-tuning the full case's weights with the embeddings and all but the
              last 2 blocks frozen (AdamW state only for the trainable ones);
  lora        rank-8 LoRA on each block's q and v (plain torch, PEFT's names) over the
              full case's weights, the base frozen.

Layouts: one `torch.save` file of {model, optimizer, scheduler, rng, step}; a DCP save of
one rank (FSDP2's format); a Hugging Face Trainer `checkpoint-<step>/` (4 safetensors
shards, the index, optimizer.pt, scheduler.pt, rng_state.pth, trainer_state.json); for
LoRA also the adapter saved alone as PEFT writes it, beside the base model's shards.

Printed for the second checkpoint of each pair: its size, the bytes still to send with
FILE dedup (files whose sha256 equals a stored file: Lifeboat today, the baseline) and
with TENSOR dedup (each tensor's bytes hashed alone: its range of a safetensors file, its
item of a DCP file, its storage record in a torch zip; headers, pickles and small files
count whole), and their ratio. Any nonzero gradient or weight decay changes a whole
tensor, so the figures do not depend on --steps.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import shutil
import struct
import sys
import tempfile
import time
import warnings
import zipfile
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import corpus  # noqa: E402

VOCAB, WIDTH, BLOCKS, HEADS, CONTEXT, BATCH = 16384, 256, 12, 4, 128, 4
TRAINABLE_BLOCKS, LORA_RANK, LORA_ALPHA, SHARDS = 2, 8, 16, 4
MiB = 1 << 20


class LoRALinear(nn.Module):
    """A frozen linear layer plus B·A, named as PEFT names it (base_layer, lora_A, lora_B)."""

    def __init__(self, base: nn.Linear):
        super().__init__()
        self.base_layer, self.scale = base, LORA_ALPHA / LORA_RANK
        self.lora_A = nn.Linear(base.in_features, LORA_RANK, bias=False)
        self.lora_B = nn.Linear(LORA_RANK, base.out_features, bias=False)
        nn.init.zeros_(self.lora_B.weight)  # PEFT's start: the adapter adds nothing

    def forward(self, x):
        return self.base_layer(x) + self.lora_B(self.lora_A(x)) * self.scale


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.q, self.k, self.v, self.o = (nn.Linear(WIDTH, WIDTH) for _ in range(4))
        self.fc, self.proj = nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x):
        (b, t, _), h = x.shape, self.ln1(x)
        q, k, v = (p(h).view(b, t, HEADS, -1).transpose(1, 2) for p in (self.q, self.k, self.v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, WIDTH))
        return x + self.proj(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, WIDTH), nn.Embedding(CONTEXT, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(BLOCKS))
        self.ln_f = nn.LayerNorm(WIDTH)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x) @ self.wte.weight.T  # tied head: one tensor, saved once


class Trainer:
    """One case: a model, AdamW over its trainable parameters, a warmup schedule."""

    def __init__(self, model: GPT, seed: int):
        self.model, self.step, self.losses = model, 0, []
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(self.params, lr=3e-4, weight_decay=0.1)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda s: min(1.0, (s + 1) / 100))
        self.data = torch.Generator().manual_seed(seed)

    def train(self, steps: int) -> None:
        for _ in range(steps):
            tokens = torch.randint(VOCAB, (BATCH, CONTEXT + 1), generator=self.data)
            logits = self.model(tokens[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
            loss.backward()
            self.opt.step()
            self.sched.step()
            self.opt.zero_grad(set_to_none=True)
            self.step += 1
            self.losses.append({"step": self.step, "loss": round(loss.item(), 4)})

    def extras(self) -> dict:
        rng = {"python": random.getstate(), "cpu": torch.get_rng_state()}
        return dict(optimizer=self.opt.state_dict(), scheduler=self.sched.state_dict(), rng=rng)

    def save_trainer_files(self, folder: Path) -> None:
        # What the Hugging Face Trainer writes beside the weights in checkpoint-<step>/.
        for key, obj in self.extras().items():
            torch.save(obj, folder / {"rng": "rng_state.pth"}.get(key, f"{key}.pt"))
        state = {"global_step": self.step, "log_history": self.losses}
        (folder / "trainer_state.json").write_text(json.dumps(state, indent=2))

    def digests(self) -> list[tuple[str, str, int]]:
        """(kind, sha256, bytes) of every model and optimizer tensor, in a fixed order."""
        state = self.opt.state_dict()["state"]
        items = [("model", t) for t in self.model.state_dict().values()]
        items += [("optim", t) for s in state.values() for t in s.values()]
        raw = [(kind, t.detach().contiguous().reshape(-1).view(torch.uint8)) for kind, t in items]
        return [(k, hashlib.sha256(r.numpy()).hexdigest(), r.numel()) for k, r in raw]


def save_shards(folder: Path, state: dict) -> None:
    """model-0000i-of-0000n.safetensors and the index, split in key order as huggingface_hub
    does (a new shard when the next tensor would pass max_shard_size, here total/SHARDS)."""
    folder.mkdir(parents=True, exist_ok=True)
    total = sum(t.numel() * t.element_size() for t in state.values())
    groups, size = [{}], 0
    for key, tensor in state.items():
        nbytes = tensor.numel() * tensor.element_size()
        if groups[-1] and size + nbytes > -(-total // SHARDS):
            groups, size = [*groups, {}], 0
        groups[-1][key], size = tensor.detach().contiguous(), size + nbytes
    weight_map = {}
    for i, group in enumerate(groups, start=1):
        name = f"model-{i:05d}-of-{len(groups):05d}.safetensors"
        save_file(group, str(folder / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(group, name))
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def write_checkpoint(case: str, trainer: Trainer, root: Path) -> dict[str, Path]:
    """Every layout of one checkpoint of `case`: {layout: its location}."""
    out, tag, state = {}, f"step{trainer.step}", trainer.model.state_dict()
    # One file of everything, as a plain loop or Lightning writes it.
    out["torch.save, one file"] = path = root / case / "single" / tag / "model.pt"
    path.parent.mkdir(parents=True)
    torch.save({"model": state, **trainer.extras(), "step": trainer.step}, path)
    # FSDP2's format on one rank; with N ranks each __<r>_0.distcp holds a slice of every tensor.
    out["DCP, 1 rank"] = root / case / "dcp" / tag
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        full = {"model": state, "optim": trainer.opt.state_dict(), "step": trainer.step}
        dcp.save(full, checkpoint_id=out["DCP, 1 rank"], no_dist=True)
    out["HF Trainer folder"] = folder = root / case / "hf" / f"checkpoint-{trainer.step}"
    save_shards(folder, state)
    trainer.save_trainer_files(folder)
    if case == "lora":
        # PEFT's save_pretrained: the adapter's tensors only, prefixed base_model.model.;
        # the base model's folder, unchanged, is part of what the job reports.
        out["adapter alone + base"] = folder = root / case / "adapter" / tag
        (folder / "checkpoint").mkdir(parents=True)
        adapter = {f"base_model.model.{k}": v for k, v in state.items() if ".lora_" in k}
        save_file(adapter, str(folder / "checkpoint" / "adapter_model.safetensors"))
        config = {"peft_type": "LORA", "r": LORA_RANK, "lora_alpha": LORA_ALPHA}
        (folder / "checkpoint" / "adapter_config.json").write_text(json.dumps(config))
        trainer.save_trainer_files(folder / "checkpoint")
        base = {k.replace(".base_layer", ""): v for k, v in state.items() if ".lora_" not in k}
        save_shards(folder / "base", base)
    return out


def tensor_chunks(path: Path) -> list[tuple[str, int]]:
    """(sha256, size) of each tensor's bytes in a file, the units tensor-level dedup would
    store. Files of no known format have none: they count whole."""
    ranges = []  # (offset, length) in the file
    if path.suffix == ".safetensors":
        with path.open("rb") as f:
            length = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(length))
        header.pop("__metadata__", None)
        ranges = [(8 + length + a, b - a) for a, b in (v["data_offsets"] for v in header.values())]
    elif path.suffix == ".distcp":  # the items' ranges are in the folder's .metadata
        items = dcp.FileSystemReader(path.parent).read_metadata().storage_data.values()
        ranges = [(i.offset, i.length) for i in items if i.relative_path == path.name]
    elif zipfile.is_zipfile(path):  # torch.save: one record per storage, stored uncompressed
        with zipfile.ZipFile(path) as archive, path.open("rb") as f:
            for info in archive.infolist():
                if re.search(r"/data/\d+$", info.filename):  # a storage, not the pickle
                    f.seek(info.header_offset + 26)  # the local header's name/extra lengths
                    name_len, extra_len = struct.unpack("<HH", f.read(4))
                    ranges.append((info.header_offset + 30 + name_len + extra_len, info.file_size))
    with path.open("rb") as f:
        return [(hashlib.sha256(os.pread(f.fileno(), n, at)).hexdigest(), n) for at, n in ranges]


def compare(first: Path, second: Path) -> dict:
    """Bytes of `second`, and those still to send with file / tensor dedup once `first` is
    stored (and what came earlier in `second` itself, as a content-addressed store does)."""
    old, new = corpus.manifest(first), corpus.manifest(second)
    base = {p: p.parent if p.is_file() else p for p in (first, second)}
    known_files = {f["sha256"] for f in old}
    known_chunks = {h for f in old for h, _ in tensor_chunks(base[first] / f["path"])}
    file_new = tensor_new = 0
    for f in new:
        if f["sha256"] in known_files:
            continue  # either scheme has the whole file already
        known_files.add(f["sha256"])
        file_new += f["size"]
        tensor_new += f["size"]
        for digest, nbytes in tensor_chunks(base[second] / f["path"]):
            tensor_new -= nbytes if digest in known_chunks else 0  # equal tensors in one file too
            known_chunks.add(digest)
    size = sum(f["size"] for f in new)
    return {"files": len(new), "size": size, "file": file_new, "tensor": tensor_new}


def make_case(case: str, pretrained: GPT | None) -> Trainer:
    torch.manual_seed(1)
    model = GPT()
    if pretrained is not None:
        model.load_state_dict(pretrained.state_dict())
    if case == "frozen":
        trainable = tuple(f"blocks.{BLOCKS - 1 - i}." for i in range(TRAINABLE_BLOCKS))
        for name, p in model.named_parameters():
            p.requires_grad = name.startswith((*trainable, "ln_f."))
    elif case == "lora":
        model.requires_grad_(False)
        for block in model.blocks:
            block.q, block.v = LoRALinear(block.q), LoRALinear(block.v)
    return Trainer(model, seed={"full": 10, "frozen": 20, "lora": 30}[case])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--warmup", type=int, default=2, help="steps before the first save")
    parser.add_argument("--steps", type=int, default=2, help="steps between the two saves")
    parser.add_argument("--keep", type=Path, help="write here and keep (default: a temp dir)")
    args = parser.parse_args()
    if args.keep:
        shutil.rmtree(args.keep, ignore_errors=True)
    root = args.keep or Path(tempfile.mkdtemp(prefix="lifeboat-dedup-"))
    started, rows, pretrained = time.monotonic(), [], None
    try:
        for case in ("full", "frozen", "lora"):
            trainer = make_case(case, pretrained)
            trainer.train(args.warmup)
            first, before = write_checkpoint(case, trainer, root), trainer.digests()
            trainer.train(args.steps)
            second, after = write_checkpoint(case, trainer, root), trainer.digests()
            rows += [(case, k, compare(first[k], second[k])) for k in first]
            # Which tensors changed, by kind, from memory: the same in every layout.
            changed = [a for a, b in zip(after, before, strict=True) if a[1] != b[1]]
            share = sum(n for k, _, n in changed if k == "optim") / sum(n for *_, n in changed)
            print(f"{case}: {sum(p.numel() for p in trainer.params) / 1e6:.2f} M of "
                  f"{sum(p.numel() for p in trainer.model.parameters()) / 1e6:.2f} M parameters "
                  f"trained, saved at steps {args.warmup} and {trainer.step}; optimizer state is "
                  f"{share:.0%} of the changed tensor bytes", flush=True)  # fmt: skip
            if case == "full":
                pretrained = trainer.model  # the weights the other cases fine-tune
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    head = ["case", "layout", "files", "2nd ckpt MiB", "new MiB, file dedup (baseline)",
            "new MiB, tensor dedup", "saving (file ÷ tensor)"]  # fmt: skip
    print("\n| " + " | ".join(head) + " |\n| --- | --- |" + " ---: |" * (len(head) - 2))
    for case, layout, r in rows:
        mib = [f"{r[k] / MiB:.1f}" for k in ("size", "file", "tensor")]
        ratio = f"{r['file'] / r['tensor']:.2f}×"
        print("| " + " | ".join([case, layout, str(r["files"]), *mib, ratio]) + " |")
    print(f"\n{time.monotonic() - started:.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
