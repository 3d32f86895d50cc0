// Replays the conformance vectors (spec/conformance/README.md, format 2)
// through the TypeScript core.
//
//   node dist/replay.js PATH...        (vector files or folders of *.json)
//
// One line per vector: `ok NAME (N steps)` or its first mismatch. Exit 0 when
// every vector passes, 1 on any mismatch (or a malformed vector), 2 on bad
// usage (no path, a path that does not exist, no vector file found).

import * as fs from "fs";
import * as path from "path";
import {
  ConsumerCore, Decision, FailureKind, IllegalTransition, OffsetOrderError, PartitionState,
  RetryPolicy, TopicPartition,
} from "./core";
import { Json, JsonObject, jsonEqual, parseJson, showJson } from "./json";

/** A vector that does not follow the format (not a behaviour of the core). */
class BadVector extends Error {
  override readonly name = "BadVector";
}

// -- reading arguments --------------------------------------------------------

function isObject(v: Json | undefined): v is JsonObject {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

function field(obj: JsonObject, key: string): Json {
  if (!Object.prototype.hasOwnProperty.call(obj, key)) throw new BadVector(`missing field ${JSON.stringify(key)}`);
  return obj[key]!;
}

function int(obj: JsonObject, key: string): bigint {
  const v = field(obj, key);
  if (typeof v !== "bigint") throw new BadVector(`${key} is not an integer: ${showJson(v)}`);
  return v;
}

function double(obj: JsonObject, key: string): number {
  const v = field(obj, key);
  if (typeof v !== "number") throw new BadVector(`${key} is not a double: ${showJson(v)}`);
  return v;
}

function ints(obj: JsonObject, key: string): bigint[] {
  const v = field(obj, key);
  if (!Array.isArray(v)) throw new BadVector(`${key} is not a list`);
  return v.map((x) => {
    if (typeof x !== "bigint") throw new BadVector(`${key} holds a non-integer: ${showJson(x)}`);
    return x;
  });
}

function tpOf(obj: JsonObject): TopicPartition {
  const v = field(obj, "tp");
  if (typeof v !== "string") throw new BadVector(`tp is not a string`);
  return TopicPartition.parse(v);
}

function kindOf(obj: JsonObject): FailureKind {
  const v = field(obj, "kind");
  if (v !== "retryable" && v !== "unknown" && v !== "permanent") throw new BadVector(`bad kind ${showJson(v)}`);
  return v;
}

// -- core values as JSON ----------------------------------------------------

function decisionJson(d: Decision | null): Json {
  if (d === null) return null;
  const base: JsonObject = { type: d.type, tp: d.tp.toString(), epoch: d.epoch, offset: d.offset };
  switch (d.type) {
    case "Commit": return { ...base, finished_above: [...d.finishedAbove] };
    case "RetryAt": return { ...base, attempt: d.attempt, at: d.at };
    case "DeadLetter": return { ...base, attempts: d.attempts, kind: d.kind };
  }
}

function partitionJson(s: PartitionState): Json {
  return {
    epoch: s.epoch, next: s.next, processed: s.processed, committed: s.committed,
    requested: s.requested, unsent: s.unsent, draining: s.draining,
    in_flight: { ...s.inFlight }, finished_above: [...s.finishedAbove],
  };
}

function stateJson(core: ConsumerCore): Json {
  const out: JsonObject = {};
  for (const [tp, s] of Object.entries(core.snapshot())) out[tp] = partitionJson(s);
  return out;
}

/** Calls the core method named by `op` with `args`; the answer as JSON. */
function call(core: ConsumerCore, op: string, a: JsonObject): Json {
  switch (op) {
    case "assign": return core.assign(tpOf(a), int(a, "committed"), ints(a, "finished_above"));
    case "restored": return core.restored(tpOf(a), int(a, "committed"), ints(a, "finished_above"));
    case "crashed": return core.crashed();
    case "fetched": {
      const end = field(a, "end");
      if (end !== null && typeof end !== "bigint") throw new BadVector(`end is not an integer or null`);
      return core.fetched(tpOf(a), int(a, "epoch"), ints(a, "offsets"), end);
    }
    case "started": return core.started(tpOf(a), int(a, "epoch"), int(a, "offset"));
    case "succeeded": return core.succeeded(tpOf(a), int(a, "epoch"), int(a, "offset"));
    case "retry_due": return core.retryDue(tpOf(a), int(a, "epoch"), int(a, "offset"));
    case "dead_lettered": return core.deadLettered(tpOf(a), int(a, "epoch"), int(a, "offset"));
    case "handed_off": return core.handedOff(tpOf(a), int(a, "epoch"), int(a, "offset"));
    case "started_many": return core.startedMany(tpOf(a), int(a, "epoch"), ints(a, "offsets"));
    case "succeeded_many": return core.succeededMany(tpOf(a), int(a, "epoch"), ints(a, "offsets"));
    case "dead_lettered_many": return core.deadLetteredMany(tpOf(a), int(a, "epoch"), ints(a, "offsets"));
    case "failed":
      return decisionJson(core.failed(tpOf(a), int(a, "epoch"), int(a, "offset"), kindOf(a),
                                      double(a, "now"), double(a, "jitter")));
    case "commit_requested": return decisionJson(core.commitRequested(tpOf(a)));
    case "commit_acked": return core.commitAcked(tpOf(a), int(a, "epoch"), int(a, "offset"));
    case "commit_failed": return core.commitFailed(tpOf(a), int(a, "epoch"), int(a, "offset"));
    case "revoking": return core.revoking(tpOf(a));
    case "revoked": return decisionJson(core.revoked(tpOf(a)));
    default: throw new BadVector(`unknown op ${JSON.stringify(op)}`);
  }
}

// -- one vector ---------------------------------------------------------------

/** Replays one vector; the first mismatch as text, or null when it passes. */
function replay(vector: JsonObject): { steps: number; mismatch: string | null } {
  const format = field(vector, "format");
  if (format !== 2n) throw new BadVector(`format ${showJson(format)} (only 2 is supported)`);
  const retry = field(vector, "retry");
  if (!isObject(retry)) throw new BadVector("retry is not an object");
  const core = new ConsumerCore(new RetryPolicy(int(retry, "max_retries"), double(retry, "base_delay"),
                                                double(retry, "max_delay")));
  const steps = field(vector, "steps");
  if (!Array.isArray(steps)) throw new BadVector("steps is not a list");
  for (let i = 0; i < steps.length; i++) {
    const step = steps[i]!;
    if (!isObject(step)) throw new BadVector(`step ${i} is not an object`);
    const op = field(step, "op");
    const args = field(step, "args");
    if (typeof op !== "string" || !isObject(args)) throw new BadVector(`step ${i}: bad op or args`);
    const hasResult = Object.prototype.hasOwnProperty.call(step, "result");
    const hasError = Object.prototype.hasOwnProperty.call(step, "error");
    if (hasResult === hasError) throw new BadVector(`step ${i}: needs exactly one of result and error`);
    const where = `step ${i} (${op} ${showJson(args)})`;

    let got: { result: Json } | { error: string };
    try {
      got = { result: call(core, op, args) };
    } catch (e) {
      if (e instanceof BadVector) throw new BadVector(`${where}: ${e.message}`);
      if (e instanceof IllegalTransition || e instanceof OffsetOrderError) got = { error: e.name };
      else got = { error: `${(e as Error).name}: ${(e as Error).message}` };
    }
    const want = hasResult ? { result: step["result"]! } : { error: step["error"]! };
    const same = "result" in want
      ? "result" in got && jsonEqual(got.result, want.result)
      : "error" in got && got.error === want.error;
    if (!same) {
      const show = (x: { result: Json } | { error: Json | string }): string =>
        "result" in x ? `result ${showJson(x.result)}` : `error ${typeof x.error === "string" ? x.error : showJson(x.error)}`;
      return { steps: steps.length, mismatch: `${where}: expected ${show(want)}, got ${show(got)}` };
    }
    const state = stateJson(core);
    if (!jsonEqual(state, field(step, "state"))) {
      return {
        steps: steps.length,
        mismatch: `${where}: state expected ${showJson(step["state"]!)}, got ${showJson(state)}`,
      };
    }
  }
  return { steps: steps.length, mismatch: null };
}

// -- main ---------------------------------------------------------------------

function vectorFiles(paths: string[]): string[] | string {
  const files: string[] = [];
  for (const p of paths) {
    if (!fs.existsSync(p)) return `no such file or folder: ${p}`;
    const st = fs.statSync(p);
    if (st.isDirectory()) {
      for (const name of fs.readdirSync(p).sort()) {
        if (name.endsWith(".json")) files.push(path.join(p, name));
      }
    } else {
      files.push(p);
    }
  }
  return files.length > 0 ? files : `no vector (*.json) in ${paths.join(", ")}`;
}

function main(argv: string[]): number {
  if (argv.length === 0 || argv.some((a) => a.startsWith("-"))) {
    process.stderr.write("usage: node dist/replay.js VECTOR_FOLDER_OR_FILE...\n");
    return 2;
  }
  const files = vectorFiles(argv);
  if (typeof files === "string") {
    process.stderr.write(`replay: ${files}\n`);
    return 2;
  }
  let failed = 0;
  for (const file of files) {
    const stem = path.basename(file, ".json");
    let line: string;
    try {
      const vector = parseJson(fs.readFileSync(file, "utf8"));
      if (!isObject(vector)) throw new BadVector("not a JSON object");
      const name = field(vector, "name");
      if (name !== stem) throw new BadVector(`name ${showJson(name)} is not the file's stem`);
      const { steps, mismatch } = replay(vector);
      line = mismatch === null ? `ok ${stem} (${steps} steps)` : `FAIL ${stem}: ${mismatch}`;
    } catch (e) {
      line = `FAIL ${stem}: bad vector: ${(e as Error).message}`;
    }
    if (line.startsWith("FAIL")) failed++;
    process.stdout.write(line + "\n");
  }
  process.stdout.write(`${files.length - failed} of ${files.length} vectors pass\n`);
  return failed === 0 ? 0 : 1;
}

process.exitCode = main(process.argv.slice(2));
