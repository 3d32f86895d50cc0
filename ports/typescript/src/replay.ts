// Replays the conformance vectors (spec/conformance/README.md, format 2)
// through the TypeScript core (no `kind`), gate (`"gate"`), failure decision
// (`"failures"`) and circuit breaker (`"breaker"`); any other `kind` is a
// malformed vector.
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
import { Breaker, BreakerPolicy } from "./breaker";
import { decide, Failure, FailureDecision, RetryTopic, retryTopic } from "./failures";
import { Gate, GateAction, Hold } from "./gate";
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

function bool(obj: JsonObject, key: string): boolean {
  const v = field(obj, key);
  if (typeof v !== "boolean") throw new BadVector(`${key} is not a boolean: ${showJson(v)}`);
  return v;
}

function str(obj: JsonObject, key: string): string {
  const v = field(obj, key);
  if (typeof v !== "string") throw new BadVector(`${key} is not a string: ${showJson(v)}`);
  return v;
}

function object(obj: JsonObject, key: string): JsonObject {
  const v = field(obj, key);
  if (!isObject(v)) throw new BadVector(`${key} is not an object: ${showJson(v)}`);
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

// -- gate vectors (spec §5a, "kind": "gate") --------------------------------

function byPartition(a: TopicPartition, b: TopicPartition): number {
  if (a.topic !== b.topic) return a.topic < b.topic ? -1 : 1;
  return a.partition - b.partition;
}

function tpList(obj: JsonObject, key: string): TopicPartition[] {
  const v = field(obj, key);
  if (!Array.isArray(v)) throw new BadVector(`${key} is not a list`);
  return v.map((x) => {
    if (typeof x !== "string") throw new BadVector(`${key} holds a non-name: ${showJson(x)}`);
    return TopicPartition.parse(x);
  });
}

function reasonOf(obj: JsonObject): Hold {
  const v = field(obj, "reason");
  if (v !== "flow" && v !== "breaker") throw new BadVector(`bad reason ${showJson(v)}`);
  return v;
}

function actionsJson(actions: GateAction[]): Json {
  const out: Json[] = [];
  const seeks = actions.flatMap((a) => (a.type === "Seek" ? [a] : [])).sort((a, b) => byPartition(a.tp, b.tp));
  let seeked = false;
  for (const a of actions) {
    if (a.type !== "Seek") {
      out.push({ type: a.type, tps: [...a.tps].sort(byPartition).map((tp) => tp.toString()) });
    } else if (!seeked) {
      seeked = true;
      for (const s of seeks) out.push({ type: "Seek", tp: s.tp.toString(), offset: s.offset });
    }
  }
  return out;
}

function gateStateJson(gate: Gate): Json {
  const snap = gate.snapshot();
  const partitions: JsonObject = {};
  for (const [name, p] of snap.partitions) {
    partitions[name] = { state: p.state, paused: p.paused, since: p.since, until: p.until };
  }
  return { holds: snap.holds, partitions };
}

function gateCall(gate: Gate, op: string, a: JsonObject): Json {
  switch (op) {
    case "assigned": return actionsJson(gate.assigned(tpList(a, "tps")));
    case "claimed": {
      const v = field(a, "positions");
      if (!Array.isArray(v)) throw new BadVector("positions is not a list");
      return actionsJson(gate.claimed(v.map((pair) => {
        if (!Array.isArray(pair) || pair.length !== 2 || typeof pair[0] !== "string" || typeof pair[1] !== "bigint") {
          throw new BadVector(`bad position ${showJson(pair)}`);
        }
        return [TopicPartition.parse(pair[0]), pair[1]];
      })));
    }
    case "retry_wait": return actionsJson(gate.retryWait(tpOf(a), int(a, "offset"), double(a, "until")));
    case "rolled_back": return actionsJson(gate.rolledBack(tpList(a, "stale"), double(a, "now")));
    case "tick": return actionsJson(gate.tick(double(a, "now")));
    case "revoking": return actionsJson(gate.revoking(tpList(a, "tps")));
    case "revoked": return actionsJson(gate.revoked(tpList(a, "tps")));
    case "lost": return actionsJson(gate.lost(tpList(a, "tps")));
    case "hold": return actionsJson(gate.hold(reasonOf(a)));
    case "unhold": return actionsJson(gate.unhold(reasonOf(a)));
    default: throw new BadVector(`unknown gate op ${JSON.stringify(op)}`);
  }
}

// -- failure-decision vectors (spec §4b, "kind": "failures") ---------------

function retryPolicyOf(retry: JsonObject): RetryPolicy {
  return new RetryPolicy(int(retry, "max_retries"), double(retry, "base_delay"), double(retry, "max_delay"));
}

function failureOf(f: JsonObject): Failure {
  return new Failure({
    kind: kindOf(f), poison: bool(f, "poison"), fatal: bool(f, "fatal"), tooLarge: bool(f, "too_large"),
    fromRetryTopic: bool(f, "from_retry_topic"), priorAttempts: int(f, "prior_attempts"),
  });
}

function failureDecisionJson(d: FailureDecision): Json {
  const base: JsonObject = { type: d.type, tp: d.tp.toString(), epoch: d.epoch, offset: d.offset };
  switch (d.type) {
    case "RetryAt": return { ...base, attempt: d.attempt, at: d.at };
    case "DeadLetter": return { ...base, attempts: d.attempts, kind: d.kind };
    case "HandOff": return { ...base, topic: d.topic, attempt: d.attempt, due: d.due };
  }
}

function failuresCall(op: string, a: JsonObject): Json {
  if (op !== "decide") throw new BadVector(`unknown failures op ${JSON.stringify(op)}`);
  const failure = failureOf(object(a, "failure"));
  const topic = field(a, "retry_topic");
  let rt: RetryTopic | null = null;
  if (topic !== null) {
    if (!isObject(topic)) throw new BadVector(`retry_topic is not null or an object: ${showJson(topic)}`);
    const pairs = Object.prototype.hasOwnProperty.call(topic, "per_source") ? field(topic, "per_source") : [];
    if (!Array.isArray(pairs) || !pairs.every((p) => Array.isArray(p) && p.length === 2
        && typeof p[0] === "string" && typeof p[1] === "string")) {
      throw new BadVector(`per_source is not a list of [source, retry] names: ${showJson(pairs)}`);
    }
    rt = retryTopic(str(topic, "name"), double(topic, "min_delay"),
      pairs.map((p) => [(p as string[])[0]!, (p as string[])[1]!] as const));
  }
  const held = field(a, "held_for");
  if (held !== null && typeof held !== "number") throw new BadVector(`held_for is not a double or null`);
  return failureDecisionJson(decide({
    tp: tpOf(a), epoch: int(a, "epoch"), offset: int(a, "offset"), failure,
    // The decision's attempts (conformance/README.md): failure_count + prior_attempts.
    attempts: int(a, "failure_count") + failure.priorAttempts,
    retry: retryPolicyOf(object(a, "retry")), retryTopic: rt,
    now: double(a, "now"), jitter: double(a, "jitter"), heldFor: held,
  }));
}

// -- breaker vectors (spec §4c, "kind": "breaker") --------------------------

function breakerPolicyOf(p: JsonObject): BreakerPolicy {
  return new BreakerPolicy({
    consecutive: int(p, "consecutive"), failureRate: double(p, "failure_rate"), minCalls: int(p, "min_calls"),
    window: double(p, "window"), firstBackoff: double(p, "first_backoff"), maxBackoff: double(p, "max_backoff"),
    backoffFactor: double(p, "backoff_factor"), probeTimeout: double(p, "probe_timeout"),
  });
}

function breakerCall(breaker: Breaker, op: string, a: JsonObject): Json {
  switch (op) {
    case "succeeded": return breaker.succeeded(tpOf(a), ints(a, "offsets"), double(a, "now"));
    case "failed": return breaker.failed(tpOf(a), int(a, "offset"), str(a, "error_class"), double(a, "now"));
    case "tick": return breaker.tick(double(a, "now"));
    case "probe_started": return breaker.probeStarted(tpOf(a), int(a, "offset"), double(a, "now"));
    default: throw new BadVector(`unknown breaker op ${JSON.stringify(op)}`);
  }
}

function breakerStateJson(breaker: Breaker, now: number): Json {
  const s = breaker.snapshot(now);
  return {
    state: s.state, reason: s.reason, error_class: s.errorClass, trips: s.trips, backoff: s.backoff,
    held_for: s.heldFor, streak: s.streak, window_calls: s.windowCalls, window_failures: s.windowFailures,
  };
}

// -- one vector ---------------------------------------------------------------

/** What a vector replays through (a core, a gate, the failure decision or a
 *  breaker), behind one interface. `state` is null for the failure decision,
 *  which has none: its steps carry no `state` and no `error`. */
interface Subject {
  call(op: string, args: JsonObject): Json;
  state: ((args: JsonObject) => Json) | null;
}

function subjectOf(vector: JsonObject): Subject {
  const kind = Object.prototype.hasOwnProperty.call(vector, "kind") ? vector["kind"] : undefined;
  switch (kind) {
    case undefined: {
      const core = new ConsumerCore(retryPolicyOf(object(vector, "retry")));
      return { call: (op, a) => call(core, op, a), state: () => stateJson(core) };
    }
    case "gate": {
      const gate = new Gate(double(vector, "fence_grace"));
      return { call: (op, a) => gateCall(gate, op, a), state: () => gateStateJson(gate) };
    }
    case "failures":
      return { call: failuresCall, state: null };
    case "breaker": {
      const breaker = new Breaker(breakerPolicyOf(object(vector, "policy")));
      return { call: (op, a) => breakerCall(breaker, op, a), state: (a) => breakerStateJson(breaker, double(a, "now")) };
    }
    default:
      throw new BadVector(`kind ${showJson(kind)} (none, "gate", "failures" or "breaker")`);
  }
}

/** Replays one vector; the first mismatch as text, or null when it passes. */
function replay(vector: JsonObject): { steps: number; mismatch: string | null } {
  const format = field(vector, "format");
  if (format !== 2n) throw new BadVector(`format ${showJson(format)} (only 2 is supported)`);
  const subject = subjectOf(vector);
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
    const hasState = Object.prototype.hasOwnProperty.call(step, "state");
    if (subject.state === null) {
      // Failure-decision steps: a result, never an error or a state.
      if (hasError) throw new BadVector(`step ${i}: a failure-decision step carries an error`);
      if (hasState) {
        return { steps: steps.length, mismatch: `${where}: a failure-decision step carries a state` };
      }
    } else if (!hasState) {
      throw new BadVector(`step ${i}: missing field "state"`);
    }

    let got: { result: Json } | { error: string };
    try {
      got = { result: subject.call(op, args) };
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
    if (subject.state === null) continue;
    const state = subject.state(args);
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
