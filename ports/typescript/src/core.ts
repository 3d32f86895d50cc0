// htmqc consumer core, ported from spec/README.md (§§1–6) and tla/Consumer.tla.
//
// Offsets, epochs and failure counts are `bigint` (spec §9: 64-bit or
// arbitrary precision); times, jitter and delays are IEEE-754 doubles
// (`number`). The core never reads a clock, draws a random number or does I/O
// (spec §7). No runtime dependencies.

// ---------------------------------------------------------------------------
// Errors (spec §5)
// ---------------------------------------------------------------------------

/** The event is not allowed in the current state. */
export class IllegalTransition extends Error {
  override readonly name = "IllegalTransition";
}

/** The offsets break Kafka's per-partition order. */
export class OffsetOrderError extends Error {
  override readonly name = "OffsetOrderError";
}

/** Raised only by the inspection helper `tracker(tp)`. */
export class NotAssigned extends Error {
  override readonly name = "NotAssigned";
}

// ---------------------------------------------------------------------------
// Partitions (spec §1)
// ---------------------------------------------------------------------------

/** A topic partition. Named `"topic/partition"`; the topic is everything
 *  before the last `/`. */
export class TopicPartition {
  constructor(readonly topic: string, readonly partition: number) {
    if (!Number.isSafeInteger(partition) || partition < 0) {
      throw new RangeError(`partition must be an integer >= 0, got ${partition}`);
    }
  }

  /** Parses `"topic/partition"` (the topic is everything before the last `/`). */
  static parse(name: string): TopicPartition {
    const cut = name.lastIndexOf("/");
    const partition = name.slice(cut + 1);
    if (cut < 0 || !/^(0|[1-9][0-9]*)$/.test(partition)) {
      throw new RangeError(`not a "topic/partition" name: ${JSON.stringify(name)}`);
    }
    return new TopicPartition(name.slice(0, cut), Number(partition));
  }

  toString(): string {
    return `${this.topic}/${this.partition}`;
  }
}

// ---------------------------------------------------------------------------
// Message lifecycle (spec §2)
// ---------------------------------------------------------------------------

export type LiveState = "Pending" | "Processing" | "Failed" | "Retrying";
export type FinishedState = "Succeeded" | "DeadLettered" | "HandedOff";
export type MessageState = LiveState | FinishedState;
export type LifecycleEvent =
  | "started"
  | "succeeded"
  | "failed"
  | "retry_scheduled"
  | "retry_due"
  | "dead_lettered"
  | "handed_off";

/** The transition table of spec §2: event → (source state, target state). */
export const TRANSITIONS: Readonly<Record<LifecycleEvent, { from: LiveState; to: MessageState }>> = {
  started: { from: "Pending", to: "Processing" },
  succeeded: { from: "Processing", to: "Succeeded" },
  failed: { from: "Processing", to: "Failed" },
  retry_scheduled: { from: "Failed", to: "Retrying" },
  dead_lettered: { from: "Failed", to: "DeadLettered" },
  handed_off: { from: "Failed", to: "HandedOff" },
  retry_due: { from: "Retrying", to: "Processing" },
};

function isFinished(s: MessageState): s is FinishedState {
  return s === "Succeeded" || s === "DeadLettered" || s === "HandedOff";
}

// ---------------------------------------------------------------------------
// Retry policy and backoff (spec §4)
// ---------------------------------------------------------------------------

export type FailureKind = "retryable" | "unknown" | "permanent";
const KINDS: readonly string[] = ["retryable", "unknown", "permanent"];

export class RetryPolicy {
  readonly maxRetries: bigint;
  readonly baseDelay: number;
  readonly maxDelay: number;

  constructor(maxRetries: bigint | number = 3n, baseDelay = 0.1, maxDelay = 30.0) {
    if (typeof maxRetries === "number") {
      if (!Number.isSafeInteger(maxRetries)) {
        throw new RangeError(`max_retries must be an integer, got ${maxRetries}`);
      }
      maxRetries = BigInt(maxRetries);
    }
    if (maxRetries < 0n) throw new RangeError(`max_retries must be >= 0, got ${maxRetries}`);
    // NaN fails every comparison and is refused here. Infinite delays are
    // refused too: the spec (§4) does not say, and jitter 0 × ∞ would be NaN.
    if (typeof baseDelay !== "number" || typeof maxDelay !== "number" ||
        !Number.isFinite(baseDelay) || !Number.isFinite(maxDelay) ||
        !(0 <= baseDelay && baseDelay <= maxDelay)) {
      throw new RangeError(`need finite 0 <= base_delay <= max_delay, got ${baseDelay}, ${maxDelay}`);
    }
    this.maxRetries = maxRetries;
    this.baseDelay = baseDelay;
    this.maxDelay = maxDelay;
  }

  /** `jitter × min(max_delay, base_delay × 2^min(n−1, 1000))`, in doubles, in
   *  exactly the order of spec §4. `n` ≥ 1 is the failure count. */
  delay(n: bigint, jitter: number): number {
    const k = n - 1n < 1000n ? n - 1n : 1000n;
    let p = 1; // 2^k, exact: k ≤ 1000 < 1024
    for (let i = 0n; i < k; i++) p *= 2;
    let c = this.baseDelay * p; // rounded; may overflow to +∞
    c = c < this.maxDelay ? c : this.maxDelay; // min(max_delay, c)
    return jitter * c; // rounded
  }

  /** Whether failure number `n` of a message of this kind is retried. */
  retries(kind: FailureKind, n: bigint): boolean {
    return kind !== "permanent" && n <= this.maxRetries;
  }
}

// ---------------------------------------------------------------------------
// Decisions (spec §5)
// ---------------------------------------------------------------------------

export interface Commit {
  readonly type: "Commit";
  readonly tp: TopicPartition;
  readonly epoch: bigint;
  /** The watermark to store. */
  readonly offset: bigint;
  /** Ascending. */
  readonly finishedAbove: readonly bigint[];
}

export interface RetryAt {
  readonly type: "RetryAt";
  readonly tp: TopicPartition;
  readonly epoch: bigint;
  readonly offset: bigint;
  /** The failure count so far. */
  readonly attempt: bigint;
  /** `now` + backoff. */
  readonly at: number;
}

export interface DeadLetter {
  readonly type: "DeadLetter";
  readonly tp: TopicPartition;
  readonly epoch: bigint;
  readonly offset: bigint;
  /** The failure count. */
  readonly attempts: bigint;
  /** "permanent" when the failure kind was "permanent", else "failed" (retries ran out). */
  readonly kind: "permanent" | "failed";
}

export type Decision = Commit | RetryAt | DeadLetter;

/** The state of a held partition (spec §4a). */
export interface PartitionState {
  readonly epoch: bigint;
  readonly next: bigint;
  readonly processed: bigint;
  readonly committed: bigint;
  readonly requested: bigint;
  readonly unsent: boolean;
  readonly draining: boolean;
  /** Live offset (decimal string) → its state. */
  readonly inFlight: Readonly<Record<string, LiveState>>;
  /** Ascending. */
  readonly finishedAbove: readonly bigint[];
}

function cmp(a: bigint, b: bigint): number {
  return a < b ? -1 : a > b ? 1 : 0;
}

// ---------------------------------------------------------------------------
// The per-partition tracker
// ---------------------------------------------------------------------------

/** One held partition. Every method validates completely before it changes
 *  anything, so a refused event changes nothing. The epoch check is the
 *  core's business (`ConsumerCore`), not the tracker's. */
export class PartitionTracker {
  private _next: bigint;
  private _processed: bigint;
  private _committed: bigint;
  private _requested: bigint;
  private _unsent = false;
  private _draining = false;
  /** Live offsets (Pending, Processing, Failed, Retrying). */
  private readonly live = new Map<bigint, LiveState>();
  /** Arrived offsets that finished, above `processed` (pruned as it moves). */
  private readonly done = new Set<bigint>();
  /** Restored offsets not covered by a fetch yet (all ≥ `next`). */
  private readonly restored: Set<bigint>;
  /** Failure counts of live offsets of this assignment. */
  private readonly fails = new Map<bigint, bigint>();

  constructor(readonly tp: TopicPartition, readonly epoch: bigint, committed: bigint,
              restored: Iterable<bigint>) {
    this._next = this._processed = this._committed = this._requested = committed;
    this.restored = new Set(restored);
  }

  get next(): bigint { return this._next; }
  get processed(): bigint { return this._processed; }
  get committed(): bigint { return this._committed; }
  get requested(): bigint { return this._requested; }
  get unsent(): boolean { return this._unsent; }
  get draining(): boolean { return this._draining; }

  /** The live state of `offset`, or undefined (not fetched, finished, gap). */
  stateOf(offset: bigint): LiveState | undefined { return this.live.get(offset); }
  /** The failure count of `offset` in this assignment. */
  failures(offset: bigint): bigint { return this.fails.get(offset) ?? 0n; }

  /** spec §1: arrived offsets that finished above `processed`, plus the
   *  restored offsets not fetched yet; ascending. */
  finishedAbove(): bigint[] {
    return [...this.done, ...this.restored].sort(cmp);
  }

  private refresh(): void {
    let p = this._next;
    for (const o of this.live.keys()) if (o < p) p = o;
    this._processed = p;
    for (const o of this.done) if (o < p) this.done.delete(o);
  }

  // -- fetching -------------------------------------------------------------

  fetched(offsets: readonly bigint[], end: bigint | null): bigint[] {
    if (offsets.length === 0 && end === null) return [];
    if (this._draining) throw new IllegalTransition(`${this.tp}: fetched while revoking`);
    let hi: bigint;
    if (offsets.length > 0) {
      const first = offsets[0]!;
      if (first < this._next) {
        throw new OffsetOrderError(`${this.tp}: batch starts at ${first} below next ${this._next}`);
      }
      for (let i = 1; i < offsets.length; i++) {
        if (!(offsets[i - 1]! < offsets[i]!)) {
          throw new OffsetOrderError(`${this.tp}: batch offsets not strictly increasing`);
        }
      }
      const last = offsets[offsets.length - 1]!;
      if (end !== null && end <= last) {
        throw new OffsetOrderError(`${this.tp}: end ${end} not above the last offset ${last}`);
      }
      hi = end ?? last + 1n;
    } else {
      hi = end!;
      if (hi < this._next) {
        throw new OffsetOrderError(`${this.tp}: end ${hi} below next ${this._next}`);
      }
    }
    const run: bigint[] = [];
    for (const o of offsets) {
      if (this.restored.has(o)) {
        this.done.add(o); // arrives finished
      } else {
        this.live.set(o, "Pending");
        run.push(o);
      }
    }
    for (const o of this.restored) if (o < hi) this.restored.delete(o);
    this._next = hi;
    this.refresh();
    return run;
  }

  // -- lifecycle --------------------------------------------------------------

  private check(event: LifecycleEvent, offset: bigint): void {
    const from = TRANSITIONS[event].from;
    const st = this.live.get(offset);
    if (st !== from) {
      throw new IllegalTransition(
        `${this.tp}: ${event} of offset ${offset} in state ${st ?? "not live"} (needs ${from})`);
    }
  }

  private move(event: LifecycleEvent, offset: bigint): void {
    const to = TRANSITIONS[event].to;
    if (isFinished(to)) {
      this.live.delete(offset);
      this.fails.delete(offset);
      this.done.add(offset);
      this._unsent = true;
    } else {
      this.live.set(offset, to);
    }
  }

  private checkDraining(event: LifecycleEvent): void {
    if (this._draining && (event === "started" || event === "retry_due")) {
      throw new IllegalTransition(`${this.tp}: ${event} while revoking`);
    }
  }

  /** `started`, `succeeded`, `retry_due`, `dead_lettered`, `handed_off` of one offset. */
  apply(
    event: "started" | "succeeded" | "retry_due" | "dead_lettered" | "handed_off",
    offset: bigint,
  ): true {
    this.checkDraining(event);
    this.check(event, offset);
    this.move(event, offset);
    this.refresh();
    return true;
  }

  /** The batch forms: all offsets move, or none. */
  applyMany(event: "started" | "succeeded" | "dead_lettered", offsets: readonly bigint[]): true {
    this.checkDraining(event);
    const seen = new Set<bigint>();
    for (const o of offsets) {
      if (seen.has(o)) throw new IllegalTransition(`${this.tp}: offset ${o} twice in a batch`);
      seen.add(o);
      this.check(event, o);
    }
    for (const o of offsets) this.move(event, o);
    if (isFinished(TRANSITIONS[event].to) && offsets.length > 0) {
      // an empty finishing batch finishes nothing, so raises nothing (spec §5)
      this._unsent = true;
    }
    this.refresh();
    return true;
  }

  /** `failed` (spec §4), with `retry_scheduled` as its second half. */
  failed(epoch: bigint, offset: bigint, kind: FailureKind, now: number, jitter: number,
         policy: RetryPolicy): RetryAt | DeadLetter {
    this.check("failed", offset);
    if (!KINDS.includes(kind)) throw new TypeError(`unknown failure kind ${JSON.stringify(kind)}`);
    if (!(jitter >= 0 && jitter <= 1)) throw new RangeError(`jitter ${jitter} outside [0, 1]`);
    this.move("failed", offset);
    const n = this.failures(offset) + 1n;
    this.fails.set(offset, n);
    if (policy.retries(kind, n)) {
      this.move("retry_scheduled", offset);
      return { type: "RetryAt", tp: this.tp, epoch, offset, attempt: n, at: now + policy.delay(n, jitter) };
    }
    return { type: "DeadLetter", tp: this.tp, epoch, offset, attempts: n, kind: kind === "permanent" ? "permanent" : "failed" };
  }

  // -- commits ----------------------------------------------------------------

  commitDue(): boolean {
    return this._processed > this._requested || this._unsent;
  }

  commitRequested(): Commit | null {
    if (!this.commitDue()) return null;
    this._requested = this._processed;
    this._unsent = false;
    return { type: "Commit", tp: this.tp, epoch: this.epoch, offset: this._processed,
             finishedAbove: this.finishedAbove() };
  }

  commitAcked(offset: bigint): boolean {
    if (offset > this._processed) {
      throw new IllegalTransition(`${this.tp}: ack of ${offset} above processed ${this._processed}`);
    }
    if (offset <= this._committed) return false;
    this._committed = offset;
    if (offset > this._requested) this._requested = offset;
    return true;
  }

  commitFailed(): true {
    this._requested = this._committed;
    this._unsent = true;
    return true;
  }

  revoking(): void {
    this._draining = true;
  }

  snapshot(): PartitionState {
    const inFlight: Record<string, LiveState> = {};
    for (const [o, s] of [...this.live].sort((a, b) => cmp(a[0], b[0]))) inFlight[o.toString()] = s;
    return {
      epoch: this.epoch, next: this._next, processed: this._processed,
      committed: this._committed, requested: this._requested, unsent: this._unsent,
      draining: this._draining, inFlight, finishedAbove: this.finishedAbove(),
    };
  }
}

// ---------------------------------------------------------------------------
// The consumer-level core (spec §5)
// ---------------------------------------------------------------------------

export class ConsumerCore {
  /** One counter per core, never reset (not even by `crashed`). */
  private epochCounter = 0n;
  /** Held partitions, in assignment order. */
  private readonly parts = new Map<string, PartitionTracker>();

  constructor(readonly policy: RetryPolicy = new RetryPolicy()) {}

  /** The tracker of `tp` if `epoch` is its current epoch; undefined if stale
   *  (older, newer, another partition's, or `tp` not held). */
  private current(tp: TopicPartition, epoch: bigint): PartitionTracker | undefined {
    const t = this.parts.get(tp.toString());
    return t !== undefined && t.epoch === epoch ? t : undefined;
  }

  // -- assignment -------------------------------------------------------------

  assign(tp: TopicPartition, committed: bigint, finishedAbove: readonly bigint[] = []): bigint {
    if (this.parts.has(tp.toString())) throw new IllegalTransition(`${tp} is already held`);
    if (committed < 0n) throw new OffsetOrderError(`${tp}: committed ${committed} < 0`);
    for (const o of finishedAbove) {
      if (o < committed) {
        throw new OffsetOrderError(`${tp}: finished_above offset ${o} < committed ${committed}`);
      }
    }
    const epoch = ++this.epochCounter;
    this.parts.set(tp.toString(), new PartitionTracker(tp, epoch, committed, finishedAbove));
    return epoch;
  }

  /** Exactly `assign`; a separate name so that traces say "restart after a crash". */
  restored(tp: TopicPartition, committed: bigint, finishedAbove: readonly bigint[] = []): bigint {
    return this.assign(tp, committed, finishedAbove);
  }

  /** Every partition is dropped; the epoch counter is kept. */
  crashed(): null {
    this.parts.clear();
    return null;
  }

  // -- events with an epoch ---------------------------------------------------

  fetched(tp: TopicPartition, epoch: bigint, offsets: readonly bigint[], end: bigint | null = null): bigint[] {
    const t = this.current(tp, epoch);
    return t === undefined ? [] : t.fetched(offsets, end);
  }

  started(tp: TopicPartition, epoch: bigint, offset: bigint): boolean {
    return this.current(tp, epoch)?.apply("started", offset) ?? false;
  }

  succeeded(tp: TopicPartition, epoch: bigint, offset: bigint): boolean {
    return this.current(tp, epoch)?.apply("succeeded", offset) ?? false;
  }

  retryDue(tp: TopicPartition, epoch: bigint, offset: bigint): boolean {
    return this.current(tp, epoch)?.apply("retry_due", offset) ?? false;
  }

  deadLettered(tp: TopicPartition, epoch: bigint, offset: bigint): boolean {
    return this.current(tp, epoch)?.apply("dead_lettered", offset) ?? false;
  }

  handedOff(tp: TopicPartition, epoch: bigint, offset: bigint): boolean {
    return this.current(tp, epoch)?.apply("handed_off", offset) ?? false;
  }

  startedMany(tp: TopicPartition, epoch: bigint, offsets: readonly bigint[]): boolean {
    return this.current(tp, epoch)?.applyMany("started", offsets) ?? false;
  }

  succeededMany(tp: TopicPartition, epoch: bigint, offsets: readonly bigint[]): boolean {
    return this.current(tp, epoch)?.applyMany("succeeded", offsets) ?? false;
  }

  deadLetteredMany(tp: TopicPartition, epoch: bigint, offsets: readonly bigint[]): boolean {
    return this.current(tp, epoch)?.applyMany("dead_lettered", offsets) ?? false;
  }

  failed(tp: TopicPartition, epoch: bigint, offset: bigint, kind: FailureKind, now: number,
         jitter: number): RetryAt | DeadLetter | null {
    const t = this.current(tp, epoch);
    return t === undefined ? null : t.failed(epoch, offset, kind, now, jitter, this.policy);
  }

  commitAcked(tp: TopicPartition, epoch: bigint, offset: bigint): boolean {
    return this.current(tp, epoch)?.commitAcked(offset) ?? false;
  }

  /** The offset is neither checked nor used (spec §5). */
  commitFailed(tp: TopicPartition, epoch: bigint, _offset: bigint): boolean {
    return this.current(tp, epoch)?.commitFailed() ?? false;
  }

  // -- events without an epoch ------------------------------------------------

  commitRequested(tp: TopicPartition): Commit | null {
    return this.parts.get(tp.toString())?.commitRequested() ?? null;
  }

  revoking(tp: TopicPartition): null {
    this.parts.get(tp.toString())?.revoking();
    return null;
  }

  /** The final commit (if due), then the partition is dropped. */
  revoked(tp: TopicPartition): Commit | null {
    const key = tp.toString();
    const t = this.parts.get(key);
    if (t === undefined) return null;
    const commit = t.commitRequested();
    this.parts.delete(key);
    return commit;
  }

  // -- inspection -------------------------------------------------------------

  epoch(tp: TopicPartition): bigint | null {
    return this.parts.get(tp.toString())?.epoch ?? null;
  }

  partitions(): TopicPartition[] {
    return [...this.parts.values()].map((t) => t.tp);
  }

  tracker(tp: TopicPartition): PartitionTracker {
    const t = this.parts.get(tp.toString());
    if (t === undefined) throw new NotAssigned(`${tp} is not held`);
    return t;
  }

  /** `commit_requested` for every held partition in assignment order, without nulls. */
  commits(): Commit[] {
    const out: Commit[] = [];
    for (const t of this.parts.values()) {
      const c = t.commitRequested();
      if (c !== null) out.push(c);
    }
    return out;
  }

  /** Held partitions keyed `"topic/partition"` (spec §4a). */
  snapshot(): Record<string, PartitionState> {
    const out: Record<string, PartitionState> = {};
    for (const [key, t] of this.parts) out[key] = t.snapshot();
    return out;
  }
}
