#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""`ferry simulate` end to end on sim devices: small checkpoints written with
scripts/make_sample.py, scenarios written here, `ferry simulate --json` run on
them, and the outcomes asserted from its per-job JSON lines:

  1 clean eviction: two models that do not both fit; using the second evicts
    the first and writes nothing (bytes_written 0, every evicted tensor dropped)
  2 dirty tensors evicted under a roomy host budget go to pinned (or pageable)
    RAM, nothing spills, and a later verify passes
  3 host_budget "1": dirty evictions spill (bytes_written == the modified
    bytes), and a later verify reads them back intact
  4 OOM: a reserve larger than the device with every model resident is an
    error that evicts nothing; a "use" that cannot fit stops the scenario
  5 a reserve that can be met evicts just enough, least recently used model
    first (or lowest priority first)
  6 scenario errors (unknown model, bad size, missing file, unknown key, ...)
    exit 2 with a message naming the file and the problem
  7 spill_dir on tmpfs: the spill is refused with a message that says tmpfs,
    and nothing is lost (a later verify passes)

    run_simulate.py FERRY      (ctest: test `simulate`)

Prints a "N passed, N failed" line; exits 1 if any check failed, 77 if
python3 cannot run the sample writer.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MAKE_SAMPLE = os.path.join(ROOT, "scripts", "make_sample.py")
MB = 1 << 20


class Checks:
    def __init__(self):
        self.passed = self.failed = 0

    def case(self, name, problems):
        if problems:
            self.failed += 1
            print(f"FAIL {name}")
            for p in problems:
                print(f"     {p}")
        else:
            self.passed += 1
            print(f"ok   {name}")


def fs_type(path):
    r = subprocess.run(["stat", "-f", "-c", "%T", path], capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else "?"


def disk_dir(candidates):
    """The first existing directory that is not on tmpfs/ramfs (a spill there is refused)."""
    for d in candidates:
        if d and os.path.isdir(d) and os.access(d, os.W_OK) and fs_type(d) not in ("tmpfs", "ramfs", "?"):
            return d
    return None


class Sim:
    def __init__(self, ferry, work):
        self.ferry, self.work, self.n = ferry, work, 0

    def run(self, scenario, *args, raw=None):
        """Write the scenario (a dict, or raw text) next to the checkpoints, run
        ferry simulate --json from another folder (so relative model paths must
        resolve against the scenario's folder) and return (rc, jobs, summary, stderr)."""
        self.n += 1
        path = os.path.join(self.work, f"scenario{self.n}.json")
        with open(path, "w") as f:
            f.write(raw if raw is not None else json.dumps(scenario, indent=1))
        r = subprocess.run([self.ferry, "simulate", "--json", *args, path], capture_output=True, text=True,
                           timeout=300, cwd="/")
        jobs, summary = [], None
        for line in r.stdout.splitlines():
            o = json.loads(line)
            if "summary" in o:
                summary = o["summary"]
            else:
                jobs.append(o)
        return r.returncode, jobs, summary, r.stderr.strip(), path


def inspect(ferry, path):
    r = subprocess.run([ferry, "inspect", "--json", path], capture_output=True, text=True, check=True)
    return json.loads(r.stdout)


def why(err, jobs):
    """stderr and the jobs' errors, for a message"""
    errs = [f"{j.get('job')}: {j['error']}" for j in jobs if j.get("error")]
    return "; ".join(([err] if err else []) + errs) or "(no message)"


def expect(problems, cond, what):
    if not cond:
        problems.append(what)
    return cond


def job_keys_ok(problems, jobs):
    need = ["job", "seconds", "rss", "uss", "pss", "cgroup", "device_bytes", "pinned_bytes", "host_bytes",
            "spill_bytes", "bytes_written", "bytes_read", "bytes_htod", "bytes_dtoh", "evicted", "dropped",
            "verified", "mismatches", "error"]
    for j in jobs:
        missing = [k for k in need if k not in j]
        expect(problems, not missing, f"job {j.get('job')}: keys missing: {missing}")
        for k in ("rss", "uss", "pss"):
            v = j.get(k) or {}
            expect(problems, all(isinstance(v.get(x), int) and v.get(x) > 0 for x in ("start", "end", "peak"))
                   and v["peak"] >= max(v["start"], v["end"]) * 0.95,
                   f"job {j.get('job')}: {k} is not {{start, end, peak}} > 0 with peak >= start, end: {v}")


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    ferry = os.path.abspath(sys.argv[1])
    checks = Checks()
    work = tempfile.mkdtemp(prefix="ferry-simulate-")
    try:
        for name, seed in (("a", 1), ("b", 2)):
            r = subprocess.run([sys.executable, MAKE_SAMPLE, os.path.join(work, name + ".safetensors"),
                                "--blocks", "2", "--hidden", "64", "--seed", str(seed)],
                               capture_output=True, text=True)
            if r.returncode != 0:
                print(f"skip: make_sample.py failed: {r.stderr.strip()}")
                return 77
        info = inspect(ferry, os.path.join(work, "a.safetensors"))
        A = info["total_bytes"]
        B = inspect(ferry, os.path.join(work, "b.safetensors"))["total_bytes"]
        NT = info["tensor_count"]
        size = {t["name"]: t["nbytes"] for t in info["tensors"]}
        groups = {}
        for t in info["tensors"]:
            g = t["name"].rsplit(".", 1)[0] if "." in t["name"] else t["name"]
            groups[g] = groups.get(g, 0) + t["nbytes"]
        MAXG = max(groups.values())
        MOD = ["blocks.0.attn.qkv.weight", "pos_embed"]
        M = sum(size[n] for n in MOD)
        # the modified tensors' groups (module prefixes): a group moves together, so
        # when a dirty member cannot be saved its clean mates stay on the device too
        modgroups = {n.rsplit(".", 1)[0] if "." in n else n for n in MOD}
        ingroup = [t["name"] for t in info["tensors"]
                   if (t["name"].rsplit(".", 1)[0] if "." in t["name"] else t["name"]) in modgroups]
        MG = sum(size[n] for n in ingroup)
        assert A == B, "the two samples have the same shapes"
        sim = Sim(ferry, work)
        models = {"a": "a.safetensors", "b": {"path": "b.safetensors"}}
        spill_ok = disk_dir([work, os.path.dirname(ferry), "/var/tmp"])

        # 1: clean eviction writes nothing
        p = []
        sc = {"device": "sim:1KiB", "device_budget": A + A // 2, "host_budget": "64MiB", "host_reserve": "16MiB",
              "models": models, "jobs": [{"name": "first", "use": ["a"]}, {"name": "second", "use": ["b"]}]}
        rc, jobs, summ, err, _ = sim.run(sc, "--device", "sim:64MiB")  # --device overrides the too-small one
        if expect(p, rc == 0 and len(jobs) == 2 and summ, f"exit {rc}, {len(jobs)} jobs: {why(err, jobs)}"):
            job_keys_ok(p, jobs)
            j1, j2 = jobs
            expect(p, j1["device_bytes"] == A and j1["bytes_read"] == A and j1["evicted"] == 0,
                   f"first: device {j1['device_bytes']} read {j1['bytes_read']} (want {A}), evicted {j1['evicted']}")
            expect(p, j2["evicted"] > 0 and j2["dropped"] == j2["evicted"],
                   f"second: evicted {j2['evicted']}, dropped {j2['dropped']}: every evicted tensor is clean")
            expect(p, j2["bytes_written"] == 0 and j2["bytes_dtoh"] == 0 and j2["spill_bytes"] == 0,
                   f"second: clean eviction wrote {j2['bytes_written']} / copied back {j2['bytes_dtoh']}")
            ma, mb = j2["models"]["a"], j2["models"]["b"]
            expect(p, mb["device"] == B and 0 < ma["device"] < A and ma["device"] + B <= A + A // 2,
                   f"second: b on device {mb['device']} (want {B}), a on device {ma['device']} (want 0 < . < {A})")
            expect(p, ma["source"] == A - ma["device"], f"second: a's evicted bytes are back in source: {ma}")
            expect(p, summ["ok"] and summ["evicted"] == summ["dropped"] == j2["evicted"], f"summary: {summ}")
        checks.case("1 two models over the device budget: the second evicts the first, 0 bytes written", p)

        # 2: dirty tensors to pinned RAM (and to pageable RAM when the pinned budget is spent)
        for pinned, tier in (("16MiB", "pinned"), ("1", "host")):
            p = []
            sc = {"device": "sim:64MiB", "device_budget": A, "host_budget": "64MiB", "pinned_budget": pinned,
                  "host_reserve": "16MiB", "models": models,
                  "jobs": [{"name": "edit", "use": ["a"], "modify": {"a": MOD}},
                           {"name": "switch", "use": ["b"]},
                           {"name": "back", "use": ["a"], "verify": True}]}
            rc, jobs, summ, err, path = sim.run(sc)
            if expect(p, rc == 0 and len(jobs) == 3, f"exit {rc}, {len(jobs)} jobs: {why(err, jobs)}"):
                j1, j2, j3 = jobs
                expect(p, j1["modified"] == 2 and j1["modified_bytes"] == M and j1["error"] is None,
                       f"edit: modified {j1['modified']} / {j1['modified_bytes']} bytes (want 2 / {M}): {j1['error']}")
                expect(p, j2[f"{tier}_bytes"] == M and j2["pinned_bytes"] + j2["host_bytes"] == M,
                       f"switch: {tier}_bytes {j2[tier + '_bytes']}, pinned+host "
                       f"{j2['pinned_bytes'] + j2['host_bytes']} (want {M} in {tier})")
                expect(p, j2["spill_bytes"] == 0 and j2["bytes_written"] == 0,
                       f"switch: spilled {j2['spill_bytes']}, wrote {j2['bytes_written']} (want 0)")
                expect(p, j2["bytes_dtoh"] == M and j2["evicted"] == NT and j2["dropped"] == NT - 2,
                       f"switch: dtoh {j2['bytes_dtoh']} (want {M}), evicted {j2['evicted']} (want {NT}), "
                       f"dropped {j2['dropped']} (want {NT - 2})")
                expect(p, j3["verified"] == NT and j3["mismatches"] == 0 and j3["error"] is None,
                       f"back: verified {j3['verified']} (want {NT}), mismatches {j3['mismatches']}: {j3['error']}")
                expect(p, j3["pinned_bytes"] + j3["host_bytes"] == 0 and j3["bytes_read"] == A - M,
                       f"back: RAM copies released ({j3['pinned_bytes']}, {j3['host_bytes']}), read "
                       f"{j3['bytes_read']} from the checkpoint (want {A - M})")
            if tier == "pinned":  # the readable report says the same
                r = subprocess.run([ferry, "simulate", path], capture_output=True, text=True, timeout=300)
                lines = r.stdout.splitlines()
                expect(p, r.returncode == 0 and len(lines) == 4 and lines[0].startswith("[1/3] edit: ")
                       and "rss " in lines[0] and f"verified {NT}, 0 mismatches" in lines[2]
                       and lines[3].startswith("summary: 3 of 3 jobs run, 0 failed"),
                       f"text report: exit {r.returncode}:\n{r.stdout}{r.stderr}")
            checks.case(f"2 modify, then another model under a roomy host budget: dirty tensors go to {tier} "
                        "RAM, no spill, verify passes", p)

        # 2b: pinned_reserve: the pool is pinned ahead and kept; the dirty tensors land in it
        p = []
        sc = {"device": "sim:64MiB", "device_budget": A, "host_budget": "64MiB", "pinned_budget": "16MiB",
              "pinned_reserve": "8MiB", "host_reserve": "16MiB", "models": models,
              "jobs": [{"name": "edit", "use": ["a"], "modify": {"a": MOD}},
                       {"name": "switch", "use": ["b"]},
                       {"name": "back", "use": ["a"], "verify": True}]}
        rc, jobs, summ, err, path = sim.run(sc)
        if expect(p, rc == 0 and len(jobs) == 3, f"exit {rc}, {len(jobs)} jobs: {why(err, jobs)}"):
            expect(p, jobs[1]["pinned_bytes"] == M and jobs[1]["host_bytes"] == 0,
                   f"switch: pinned {jobs[1]['pinned_bytes']}, host {jobs[1]['host_bytes']} (want {M}, 0)")
            expect(p, jobs[2]["verified"] == NT and jobs[2]["mismatches"] == 0, f"back: {jobs[2]}")
            expect(p, summ["pinned_reserve"] == 8 << 20 and summ["pinned_pool_bytes"] == 8 << 20,
                   f"summary: reserve {summ['pinned_reserve']}, pool {summ['pinned_pool_bytes']} (want 8 MiB both)")
        sc["pinned_reserve"] = "lots"
        rc, jobs, summ, err, path = sim.run(sc)
        expect(p, rc == 2 and "pinned_reserve" in err, f"a bad pinned_reserve: exit {rc}: {err}")
        checks.case("2b pinned_reserve: the pool pinned ahead takes the dirty tensors and stays", p)

        # 3: tiny host budget: dirty evictions spill, and come back intact
        p = []
        if not spill_ok:
            print("skip 3 spill: no directory off tmpfs to spill in")
        else:
            sc = {"device": "sim:64MiB", "device_budget": A, "host_budget": "1", "spill_dir": spill_ok,
                  "models": models,
                  "jobs": [{"name": "edit", "use": ["a"], "modify": {"a": MOD}},
                           {"name": "switch", "use": ["b"]},
                           {"name": "back", "use": ["a"], "verify": True},
                           {"name": "again", "use": ["b"], "verify": True}]}
            rc, jobs, summ, err, _ = sim.run(sc)
            if expect(p, rc == 0 and len(jobs) == 4, f"exit {rc}, {len(jobs)} jobs: {why(err, jobs)}"):
                j1, j2, j3, j4 = jobs
                expect(p, j2["spill_bytes"] == M and j2["bytes_written"] == M == j1["modified_bytes"],
                       f"switch: spill_bytes {j2['spill_bytes']}, bytes_written {j2['bytes_written']} "
                       f"(want the modified bytes, {M})")
                expect(p, j2["pinned_bytes"] == j2["host_bytes"] == 0, "switch: nothing in RAM under host_budget 1")
                expect(p, j3["verified"] == NT and j3["mismatches"] == 0 and j3["error"] is None,
                       f"back: verified {j3['verified']}, mismatches {j3['mismatches']}: {j3['error']}")
                expect(p, j3["bytes_read"] == A and j3["spill_bytes"] == 0,
                       f"back: read {j3['bytes_read']} (want {A}: checkpoint + spill file), spill left "
                       f"{j3['spill_bytes']}")
                expect(p, j4["verified"] == NT and j4["mismatches"] == 0,
                       f"again: b verified {j4['verified']}, mismatches {j4['mismatches']}")
                expect(p, j4["spill_bytes"] == M and j4["bytes_written"] == M,
                       f"again: a's dirty tensors spill a second time ({j4['spill_bytes']}, {j4['bytes_written']})")
                expect(p, summ["bytes_written"] == 2 * M and summ["spill_dir"] == spill_ok,
                       f"summary: written {summ['bytes_written']} (want {2 * M}), spill dir {summ['spill_dir']}")
            checks.case("3 host_budget 1: dirty evictions spill exactly the modified bytes; verify passes", p)

        # 4: OOM
        p = []
        sc = {"device": "sim:64MiB", "device_budget": 2 * A + 8192, "host_budget": "64MiB", "host_reserve": "16MiB",
              "models": models,
              "jobs": [{"name": "load", "use": ["a", "b"]},
                       {"name": "oom", "reserve": "1GiB"},
                       {"name": "after", "use": ["a"], "verify": True}]}
        rc, jobs, summ, err, _ = sim.run(sc)
        if expect(p, rc == 1 and len(jobs) == 3, f"exit {rc} (want 1), {len(jobs)} jobs (want 3): {why(err, jobs)}"):
            j1, j2, j3 = jobs
            expect(p, j1["device_bytes"] == 2 * A and j1["error"] is None, f"load: {j1['device_bytes']} {j1['error']}")
            expect(p, j2["error"] is not None and "1073741824" in j2["error"] and "nothing was evicted" in j2["error"],
                   f"oom: error {j2['error']!r}")
            expect(p, j2["evicted"] == 0 and j2["device_bytes"] == j1["device_bytes"] and j2["reserve_freed"] is None,
                   f"oom: evicted {j2['evicted']}, device {j2['device_bytes']} (want {j1['device_bytes']})")
            expect(p, j3["error"] is None and j3["mismatches"] == 0 and j3["bytes_read"] == 0,
                   f"after: the scenario goes on, nothing to load: {j3['error']}, read {j3['bytes_read']}")
            expect(p, summ["jobs_failed"] == 1 and not summ["ok"], f"summary: {summ}")
        # a "use" that cannot fit: the job fails, the scenario stops
        sc = {"device": "sim:64MiB", "device_budget": A + A // 2, "host_budget": "64MiB", "host_reserve": "16MiB",
              "models": models,
              "jobs": [{"name": "both", "use": ["a", "b"]}, {"name": "never", "use": ["a"]}]}
        rc, jobs, summ, err, _ = sim.run(sc)
        if expect(p, rc == 1 and len(jobs) == 1 and summ, f"use failure: exit {rc}, {len(jobs)} jobs: {why(err, jobs)}"):
            e = jobs[0]["error"] or ""
            expect(p, e.startswith("use b: ") and "nothing was evicted" in e,
                   f"use failure: error {e!r} (the models of one job must fit together)")
            expect(p, jobs[0]["models"]["a"]["device"] == A and jobs[0]["evicted"] == 0,
                   "use failure: a stays, nothing evicted")
            expect(p, summ["jobs_run"] == 1 and summ["jobs"] == 2, f"use failure: summary {summ}")
        checks.case("4 OOM: a reserve over the device is an error and evicts nothing; a use that cannot fit stops", p)

        # 5: a reserve that can be met evicts just enough, LRU (or lowest priority) first
        for prio in (False, True):
            p = []
            room = 8192
            need = 50000
            ms = dict(models)
            if prio:
                ms = {"a": {"path": "a.safetensors", "priority": 5}, "b": "b.safetensors"}
            sc = {"device": "sim:64MiB", "device_budget": 2 * A + room, "host_budget": "64MiB",
                  "host_reserve": "16MiB", "models": ms,
                  "jobs": [{"name": "old", "use": ["a"]}, {"name": "new", "use": ["b"]},
                           {"name": "room", "reserve": room + need}]}
            rc, jobs, summ, err, _ = sim.run(sc)
            victim, kept = ("b", "a") if prio else ("a", "b")
            if expect(p, rc == 0 and len(jobs) == 3, f"exit {rc}, {len(jobs)} jobs: {why(err, jobs)}"):
                j = jobs[2]
                freed = j["reserve_freed"]
                expect(p, j["error"] is None and freed is not None and need <= freed < need + MAXG,
                       f"room: freed {freed} (want {need} <= . < {need + MAXG}: whole groups, no more): {j['error']}")
                expect(p, j["models"][kept]["device"] == A and j["models"][victim]["device"] == A - freed,
                       f"room: {kept} untouched ({j['models'][kept]['device']}), {victim} lost exactly the freed "
                       f"bytes ({j['models'][victim]['device']} = {A} - {freed})")
                expect(p, j["evicted"] > 0 and j["dropped"] == j["evicted"] and j["bytes_written"] == 0,
                       f"room: evicted {j['evicted']}, dropped {j['dropped']}, written {j['bytes_written']}")
                expect(p, 2 * A + room - j["device_bytes"] >= room + need,
                       f"room: {2 * A + room - j['device_bytes']} bytes free after, want >= {room + need}")
            checks.case("5 a reserve that fits evicts just enough, "
                        + ("the lower-priority model first although it was used last" if prio
                           else "least recently used model first"), p)

        # 6: scenario errors: exit 2, message naming the file and the problem
        base = {"device": "sim:64MiB", "device_budget": 2 * A, "models": models, "jobs": [{"use": ["a"]}]}

        def variant(**kw):
            d = json.loads(json.dumps(base))
            d.update(kw)
            return d
        bad = [
            ("unknown model", variant(jobs=[{"name": "x", "use": ["vae"]}]), None, ["jobs[0]", "use[0]", '"vae"']),
            ("unknown model in evict", variant(jobs=[{"evict": ["a", "clip"]}]), None, ["evict[1]", '"clip"']),
            ("unknown model in modify", variant(jobs=[{"modify": {"clip": ["w"]}}]), None, ["modify.clip", '"clip"']),
            ("unknown tensor", variant(jobs=[{"use": ["a"], "modify": {"a": ["blk.0.w"]}}]), None,
             ["modify.a[0]", '"blk.0.w"', '"a"']),
            ("bad size", variant(host_budget="2 gigs"), None, ["host_budget", "2 gigs"]),
            ("bad reserve", variant(jobs=[{"reserve": -5}]), None, ["jobs[0].reserve", "negative"]),
            ("missing file", variant(models={"a": "a.safetensors", "c": "missing.safetensors"}), None,
             ["models.c", "missing.safetensors", "No such file"]),
            ("unknown key", variant(hostbudget="1GiB"), None, ['unknown key "hostbudget"']),
            ("unknown job key", variant(jobs=[{"use": ["a"], "verfy": True}]), None, ["jobs[0]", '"verfy"']),
            ("wrong type", variant(jobs=[{"use": "a"}]), None, ["jobs[0].use", "a list"]),
            ("no models", {"device": "sim:1GiB", "jobs": []}, None, ['"models"']),
            ("no device", {"models": models, "jobs": []}, None, ["device"]),
            ("bad device", variant(device="sim:lots"), None, ["device", "sim:lots"]),
            ("bad JSON", None, '{"device": "sim:1GiB",\n "models": {"a": "a.safetensors"}\n "jobs": []}', [":3:"]),
        ]
        for name, sc, raw, want in bad:
            p = []
            rc, jobs, summ, err, path = sim.run(sc, raw=raw)
            expect(p, rc == 2 and not jobs, f"exit {rc} (want 2), {len(jobs)} jobs run")
            expect(p, path in err and all(w in err for w in want) and "\n" not in err,
                   f"message {err!r} should be one line naming {path} and {want}")
            checks.case(f"6 scenario error: {name}", p)

        # 7: spill_dir on tmpfs: refused, nothing lost
        p = []
        if fs_type("/dev/shm") != "tmpfs":
            print("skip 7 tmpfs: /dev/shm is not tmpfs here")
        else:
            sc = {"device": "sim:64MiB", "device_budget": A, "host_budget": "1", "spill_dir": "/dev/shm",
                  "models": models,
                  "jobs": [{"name": "edit", "use": ["a"], "modify": {"a": MOD}},
                           {"name": "offload", "evict": ["a"]},
                           {"name": "back", "use": ["a"], "verify": True},
                           {"name": "switch", "use": ["b"]}]}
            rc, jobs, summ, err, _ = sim.run(sc)
            if expect(p, rc == 1 and len(jobs) == 4, f"exit {rc} (want 1), {len(jobs)} jobs (want 4): {why(err, jobs)}"):
                j1, j2, j3, j4 = jobs
                e2 = j2["error"] or ""
                expect(p, "tmpfs" in e2 and "/dev/shm" in e2, f"offload: error {e2!r} should say /dev/shm is tmpfs")
                expect(p, j2["models"]["a"]["device"] == MG and j2["spill_bytes"] == 0 and j2["bytes_written"] == 0,
                       f"offload: the dirty tensors and their groups stay on the device "
                       f"({j2['models']['a']['device']}, want {MG}), nothing spilled ({j2['spill_bytes']})")
                expect(p, j2["dropped"] == j2["evicted"] == NT - len(ingroup),
                       f"offload: the clean ones of other groups are dropped ({j2['dropped']}/{j2['evicted']}, "
                       f"want {NT - len(ingroup)})")
                expect(p, j3["error"] is None and j3["verified"] == NT and j3["mismatches"] == 0,
                       f"back: verified {j3['verified']}, mismatches {j3['mismatches']}: {j3['error']}")
                e4 = j4["error"] or ""
                expect(p, e4.startswith("use b: ") and "tmpfs" in e4 and j4["models"]["a"]["device"] >= MG,
                       f"switch: a use that needs the spill fails the same way ({e4!r}), a's dirty tensors stay")
            # a verify without "use" checks every model wherever its bytes are, loading nothing
            sc2 = dict(sc, jobs=[{"name": "edit", "use": ["a"], "modify": {"a": MOD}},
                                 {"name": "offload", "evict": ["a"]}, {"name": "check", "verify": True}])
            rc2, jobs2, _, err2, _ = sim.run(sc2)
            if expect(p, rc2 == 1 and len(jobs2) == 3, f"exit {rc2}, {len(jobs2)} jobs: {why(err2, jobs2)}"):
                expect(p, jobs2[2]["verified"] == 2 * NT and jobs2[2]["mismatches"] == 0,
                       f"check (every model, wherever it is): verified {jobs2[2]['verified']}, "
                       f"mismatches {jobs2[2]['mismatches']}")
            checks.case("7 spill_dir on tmpfs: the spill is refused naming tmpfs; nothing is lost", p)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{checks.passed} passed, {checks.failed} failed")
    return 1 if checks.failed else 0


if __name__ == "__main__":
    sys.exit(main())
