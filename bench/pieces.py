"""Tensor-level deduplication, measured on the real copy: what the third of three
consecutive checkpoints sends, and how long the copies take, with large files cut at
tensor boundaries (REPLICATION_PIECES_ABOVE) and without (the baseline: file dedup, what
Lifeboat did before), same SeaweedFS, same run.

    .venv/bin/weed mini -dir=/tmp/weed -ip=127.0.0.1 -ip.bind=127.0.0.1 &  # or S3_ENDPOINT_URL
    .venv/bin/python bench/pieces.py                                       # 2 min, 2 cores

The checkpoints are bench/dedup_tensors.py's (a 13.7 M parameter GPT trained on CPU,
saved three times, 2 AdamW steps apart): full training, fine-tuning with all but 2 blocks
frozen, and rank-8 LoRA over a frozen base, each as one `torch.save` file, as a Hugging
Face Trainer folder (4 safetensors shards and the Trainer's files) and as a DCP save of
one rank. Each mode copies the three checkpoints in turn to a fresh prefix, with the
replicate task as a worker runs it (workers.replicate.replicate, a scratch SQLite for its
rows). A run's first copy is sent whole in either mode (nothing to share with yet), its
second is the first one cut (what cutting costs), its third sends what changed. Files of
1 MiB or more are cut (REPLICATION_PIECES_ABOVE, 64 MiB by default, is lowered so that
this small model's shards count; a real model's shards are 1-10 GiB).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import corpus  # noqa: E402
import dedup_tensors as models  # noqa: E402
from replicate import delete_prefix, end_bench, start_bench  # noqa: E402

MiB = 1 << 20
LAYOUTS = ("torch.save, one file", "HF Trainer folder", "DCP, 1 rank")


def copy(project, run, location: Path, bucket: str, endpoint: str, prefix: str, step: int):
    """Replicate one checkpoint folder now; (bytes sent, seconds)."""
    # Django's models and tasks import only once start_bench has set Django up.
    from webapp.domain.models import Checkpoint, CheckpointFile, Replica, StorageTarget
    from workers.replicate import replicate

    files = corpus.manifest(location)
    checkpoint = Checkpoint.objects.create(
        project=project, run=run, step=step, location=str(location), status="verified",
        total_size=sum(f["size"] for f in files), file_count=len(files),
    )  # fmt: skip
    CheckpointFile.objects.bulk_create(CheckpointFile(checkpoint=checkpoint, **f) for f in files)
    target, _ = StorageTarget.objects.get_or_create(
        project=project, name=prefix, defaults={"bucket": bucket, "prefix": prefix,
                                                "endpoint_url": endpoint},
    )  # fmt: skip
    replica = Replica.objects.create(checkpoint=checkpoint, target=target)
    start = time.perf_counter()
    outcome = replicate(replica.pk)
    seconds = time.perf_counter() - start
    replica.refresh_from_db()
    if outcome != "verified":
        raise SystemExit(f"replication did not verify: {replica.last_error}")
    return replica.bytes_sent, seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--endpoint", default=os.environ.get("S3_ENDPOINT_URL", "http://127.0.0.1:8333")
    )
    parser.add_argument("--bucket", default=f"bench-pieces-{uuid.uuid4().hex[:6]}")
    args = parser.parse_args()
    work, client = start_bench("pieces", args.endpoint, args.bucket)
    from django.conf import settings  # set up by start_bench, just above

    from webapp.domain.models import Project, Run

    project = Project.objects.create(slug="bench", name="bench", allowed_roots=[str(work)])
    rows, pretrained, step = [], None, 0
    try:
        for case in ("full", "frozen", "lora"):
            trainer = models.make_case(case, pretrained)
            saves = []
            for _ in range(3):
                trainer.train(2)
                saves.append(models.write_checkpoint(case, trainer, work / "ckpt"))
            if case == "full":
                pretrained = trainer.model
            for layout in LAYOUTS:
                folders = [s[layout].parent if s[layout].is_file() else s[layout] for s in saves]
                size = sum(f["size"] for f in corpus.manifest(folders[-1]))
                measured = {}
                for mode, above in (("file", 0), ("tensor", MiB)):
                    settings.REPLICATION_PIECES_ABOVE = above
                    run = Run.objects.create(project=project, key=f"{case}-{layout}-{mode}")
                    prefix = uuid.uuid4().hex[:8]
                    copies = []
                    for folder in folders:
                        step += 1
                        copies.append(
                            copy(project, run, folder, args.bucket, args.endpoint, prefix, step)
                        )
                    # The run's first copy is whole in both modes; the second is the
                    # first one cut; the third shows what cutting saves.
                    (_, t2), (sent3, t3) = copies[1], copies[2]
                    measured[mode] = (t2, sent3, t3)
                    delete_prefix(client, args.bucket, prefix)
                rows.append((case, layout, size, measured))
                f, t = measured["file"], measured["tensor"]
                print(f"{case}, {layout}: 3rd copy sent {f[1] / MiB:.1f} MiB by file, "
                      f"{t[1] / MiB:.1f} MiB by tensor; 2nd copy {f[0]:.2f} s / {t[0]:.2f} s, "
                      f"3rd {f[2]:.2f} s / {t[2]:.2f} s", flush=True)  # fmt: skip
    finally:
        end_bench(work, client, args.bucket)
    head = ["case", "layout", "ckpt MiB", "3rd copy sent MiB, file (baseline)",
            "3rd copy sent MiB, tensor", "saving", "2nd copy s (1st cut), file / tensor",
            "3rd copy s, file / tensor"]  # fmt: skip
    print("\n| " + " | ".join(head) + " |\n| --- | --- |" + " ---: |" * (len(head) - 2))
    for case, layout, size, m in rows:
        f, t = m["file"], m["tensor"]
        ratio = f"{f[1] / t[1]:.2f}×" if t[1] else "∞"
        print(f"| {case} | {layout} | {size / MiB:.1f} | {f[1] / MiB:.1f} | {t[1] / MiB:.1f} | "
              f"{ratio} | {f[0]:.2f} / {t[0]:.2f} | {f[2]:.2f} / {t[2]:.2f} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
