"""`lifeboat storage`: what the project's checkpoints take on each storage target and
where the jobs wrote them, what it costs, what retention freed and would free, and each
target's newest audit; `--audit TARGET` lists a target now, `--clean AUDIT` deletes what
an audit found (docs/replication.md, "The storage ledger" and "The storage audit").

Standard library only, like the rest of the client."""

from __future__ import annotations

import json

from lifeboat import ops_format as fmt
from lifeboat.ops_api import OK


def run(client, args) -> int:
    if args.audit:
        print(fmt.clean(client.audit_storage(args.audit).get("message")))
        return OK
    if args.clean is not None:
        print(fmt.clean(client.clean_storage(args.clean).get("message")))
        return OK
    ledger = client.storage(args.limit)
    audits = client.storage_audits()
    if args.json:
        print(json.dumps({"ledger": ledger, "audits": audits}, indent=2))
        return OK
    totals, local = ledger.get("replicas") or {}, ledger.get("local") or {}
    cost = totals.get("monthly_cost")
    print(
        f"on storage targets: {fmt.size(totals.get('stored_bytes'))} in "
        f"{totals.get('stored_objects', 0):,} objects, {totals.get('copies', 0):,} copies; "
        f"each copy whole would take {fmt.size(totals.get('logical_bytes'))}, so deduplication "
        f"saves {fmt.size(totals.get('saved_bytes'))}"
        + (f"; {cost:,.2f} a month" if cost is not None else "")
    )
    print(
        f"where the jobs wrote them: {fmt.size(local.get('stored_bytes'))} in "
        f"{local.get('stored_files', 0):,} files"
    )
    print(
        f"retention freed {fmt.size(totals.get('freed_bytes_30d'))} on targets and "
        f"{fmt.size(local.get('freed_bytes_30d'))} locally in 30 days; the policies would free "
        f"{fmt.size(totals.get('would_free_bytes'))} and {fmt.size(local.get('would_free_bytes'))}"
        f" now (as of {fmt.when(ledger.get('taken_at'))})"
    )
    newest = {a.get("target"): a.get("audit") for a in audits}
    rows = []
    for t in ledger.get("targets") or []:
        audit = newest.get(t.get("target"))
        found = "not audited"
        if audit:
            found = (
                f"{audit.get('orphan_objects', 0):,} objects, "
                f"{fmt.size(audit.get('unaccounted_bytes'))} ({fmt.ago(audit.get('started_at'))}, "
                f"audit {audit.get('id')})"
            )
        rows.append([
            t.get("target"), fmt.size(t.get("stored_bytes")), f"{t.get('stored_objects', 0):,}",
            fmt.size(t.get("saved_bytes")),
            "" if t.get("monthly_cost") is None else f"{t['monthly_cost']:,.2f}",
            fmt.size(t.get("would_free_bytes")), found,
        ])  # fmt: skip
    print("\ntargets")
    print(fmt.table(
        ["target", "stored", "objects", "saved", "a month", "would free", "no record accounts for"],
        rows, right=("stored", "objects", "saved", "a month", "would free"),
    ))  # fmt: skip
    runs = ledger.get("runs") or []
    if runs:
        print(f"\nthe runs that store most ({len(runs)} of {ledger.get('runs_total', len(runs))})")
        print(fmt.table(
            ["run", "stored"], [[r.get("run"), fmt.size(r.get("stored_bytes"))] for r in runs],
            right=("stored",),
        ))  # fmt: skip
    return OK
