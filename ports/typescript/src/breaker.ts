// The circuit breaker, ported from spec/README.md §4c and the breaker vectors
// alone; no Python was read.
//
// Pure: every event carries `now` (double seconds, never decreasing from one
// event to the next); the breaker never reads a clock. Times are IEEE-754
// doubles, each sum, difference, product and quotient rounded once, in the
// order §4c gives; counts and the policy's integers are `bigint`.

import { IllegalTransition, TopicPartition } from "./core";

export type BreakerState = "Closed" | "Open" | "HalfOpen" | "Probing";
export type BreakerEvent =
  | "tripped" | "cooled_down" | "probe_started" | "probe_succeeded" | "probe_failed" | "probe_lost";
export type TripReason = "" | "consecutive" | "failure_rate";

/** TRANSITIONS[state][event] -> state (§4c); each event has exactly one edge. */
export const TRANSITIONS: Readonly<Record<BreakerEvent, { from: BreakerState; to: BreakerState }>> = {
  tripped: { from: "Closed", to: "Open" },
  cooled_down: { from: "Open", to: "HalfOpen" },
  probe_started: { from: "HalfOpen", to: "Probing" },
  probe_succeeded: { from: "Probing", to: "Closed" },
  probe_failed: { from: "Probing", to: "Open" },
  probe_lost: { from: "Probing", to: "HalfOpen" },
};

/** The breaker's policy (§4c); refused when built unless every rule holds. */
export class BreakerPolicy {
  readonly consecutive: bigint;
  readonly failureRate: number;
  readonly minCalls: bigint;
  readonly window: number;
  readonly firstBackoff: number;
  readonly maxBackoff: number;
  readonly backoffFactor: number;
  readonly probeTimeout: number;

  constructor(p: {
    consecutive?: bigint; failureRate?: number; minCalls?: bigint; window?: number;
    firstBackoff?: number; maxBackoff?: number; backoffFactor?: number; probeTimeout?: number;
  } = {}) {
    this.consecutive = p.consecutive ?? 10n;
    this.failureRate = p.failureRate ?? 0.5;
    this.minCalls = p.minCalls ?? 20n;
    this.window = p.window ?? 30.0;
    this.firstBackoff = p.firstBackoff ?? 1.0;
    this.maxBackoff = p.maxBackoff ?? 60.0;
    this.backoffFactor = p.backoffFactor ?? 2.0;
    this.probeTimeout = p.probeTimeout ?? 60.0;
    // §4c: every double of the policy is finite (neither NaN nor infinite).
    const doubles = [this.failureRate, this.window, this.firstBackoff, this.maxBackoff,
                     this.backoffFactor, this.probeTimeout];
    const rules: [boolean, string][] = [
      [doubles.every(Number.isFinite), "finite doubles"],
      [this.consecutive >= 1n, "consecutive >= 1"],
      [this.failureRate > 0 && this.failureRate <= 1, "0 < failure_rate <= 1"],
      [this.minCalls >= 1n, "min_calls >= 1"],
      [this.window > 0, "window > 0"],
      [this.firstBackoff > 0 && this.firstBackoff <= this.maxBackoff, "0 < first_backoff <= max_backoff"],
      [this.backoffFactor >= 1, "backoff_factor >= 1"],
      [this.probeTimeout > 0, "probe_timeout > 0"],
    ];
    for (const [ok, rule] of rules) if (!ok) throw new RangeError(`breaker policy: need ${rule}`);
  }
}

/** `snapshot(now)` (§4c). */
export interface BreakerSnapshot {
  readonly state: BreakerState;
  readonly reason: TripReason;
  readonly errorClass: string;
  readonly trips: bigint;
  readonly backoff: number;
  readonly heldFor: number | null;
  readonly streak: bigint;
  readonly windowCalls: bigint;
  readonly windowFailures: bigint;
}

/** A message as the streak and the probe name it: (tp, offset). */
function messageKey(tp: TopicPartition, offset: bigint): string {
  return `${offset} ${tp.toString()}`; // the offset holds no space: unambiguous
}

export class Breaker {
  private _state: BreakerState = "Closed";
  private backoff: number;
  /** Set exactly while Open. */
  private openUntil: number | null = null;
  /** Set exactly while Probing. */
  private probe: { tp: TopicPartition; offset: bigint } | null = null;
  private probeSince: number | null = null;
  private readonly streak = new Set<string>();
  private streakClass = "";
  /** bucket number → calls and failures recorded in it. */
  private readonly buckets = new Map<number, { calls: bigint; failures: bigint }>();
  private reason: TripReason = "";
  private errorClass = "";
  private trips = 0n;

  constructor(readonly policy: BreakerPolicy = new BreakerPolicy()) {
    this.backoff = policy.firstBackoff;
  }

  get state(): BreakerState {
    return this._state;
  }

  // -- the window --------------------------------------------------------------

  /** `floor(t / w)` with `w = window / 10`, each division rounded to a double. */
  private bucket(t: number): number {
    return Math.floor(t / (this.policy.window / 10));
  }

  private record(now: number, calls: bigint, failures: bigint): void {
    const k = this.bucket(now);
    const b = this.buckets.get(k) ?? { calls: 0n, failures: 0n };
    b.calls += calls;
    b.failures += failures;
    this.buckets.set(k, b);
    // Buckets before bucket(now) − 9 never count again (`now` never decreases).
    for (const old of [...this.buckets.keys()]) if (old < k - 9) this.buckets.delete(old);
  }

  /** `(calls, failures)` summed over the buckets k with bucket(now) − 9 ≤ k ≤ bucket(now). */
  windowCounts(now: number): { calls: bigint; failures: bigint } {
    const top = this.bucket(now);
    let calls = 0n;
    let failures = 0n;
    for (const [k, b] of this.buckets) {
      if (top - 9 <= k && k <= top) {
        calls += b.calls;
        failures += b.failures;
      }
    }
    return { calls, failures };
  }

  // -- events ------------------------------------------------------------------

  private go(event: BreakerEvent): BreakerEvent {
    const edge = TRANSITIONS[event];
    if (edge.from !== this._state) {
      throw new IllegalTransition(`breaker: can't handle ${event} when ${this._state}`);
    }
    this._state = edge.to;
    return event;
  }

  /** Handler calls on `offsets` (may be empty) of `tp` succeeded. */
  succeeded(tp: TopicPartition, offsets: readonly bigint[], now: number): "probe_succeeded" | null {
    if (this._state === "Closed") {
      if (offsets.length > 0) {
        this.streak.clear(); // streakClass kept
        this.record(now, BigInt(offsets.length), 0n);
      }
      return null;
    }
    const probe = this.probe;
    if (this._state === "Probing" && probe !== null && probe.tp.toString() === tp.toString() &&
        offsets.includes(probe.offset)) {
      this.backoff = this.policy.firstBackoff;
      this.probe = null;
      this.probeSince = null;
      this.go("probe_succeeded");
      return "probe_succeeded";
    }
    return null;
  }

  /** The handler call on `offset` of `tp` raised an exception of class `errorClass`. */
  failed(tp: TopicPartition, offset: bigint, errorClass: string, now: number): "tripped" | "probe_failed" | null {
    if (this._state === "Closed") {
      if (errorClass !== this.streakClass) { // 1
        this.streakClass = errorClass;
        this.streak.clear();
      }
      this.streak.add(messageKey(tp, offset)); // 2
      this.record(now, 1n, 1n); // 3
      if (BigInt(this.streak.size) >= this.policy.consecutive) { // 4
        return this.trip("consecutive", errorClass, now);
      }
      const { calls, failures } = this.windowCounts(now); // 5
      if (calls >= this.policy.minCalls && Number(failures) >= this.policy.failureRate * Number(calls)) {
        return this.trip("failure_rate", errorClass, now);
      }
      return null; // 6
    }
    const probe = this.probe;
    if (this._state === "Probing" && probe !== null && probe.tp.toString() === tp.toString() &&
        probe.offset === offset) {
      const grown = this.backoff * this.policy.backoffFactor; // rounded
      this.backoff = grown < this.policy.maxBackoff ? grown : this.policy.maxBackoff;
      this.errorClass = errorClass; // reason and trips unchanged
      this.openUntil = now + this.backoff;
      this.probe = null;
      this.probeSince = null;
      this.go("probe_failed");
      return "probe_failed";
    }
    return null;
  }

  private trip(reason: "consecutive" | "failure_rate", errorClass: string, now: number): "tripped" {
    this.reason = reason;
    this.errorClass = errorClass;
    this.trips += 1n;
    this.streak.clear();
    this.streakClass = "";
    this.buckets.clear();
    this.openUntil = now + this.backoff; // backoff is first_backoff while Closed
    this.go("tripped");
    return "tripped";
  }

  /** Time passed (the caller calls it every turn). */
  tick(now: number): "cooled_down" | "probe_lost" | null {
    if (this._state === "Open" && this.openUntil !== null && now >= this.openUntil) {
      this.openUntil = null;
      this.go("cooled_down");
      return "cooled_down";
    }
    if (this._state === "Probing" && this.probeSince !== null && now - this.probeSince >= this.policy.probeTimeout) {
      this.probe = null;
      this.probeSince = null;
      this.go("probe_lost"); // backoff unchanged
      return "probe_lost";
    }
    return null;
  }

  /** The one message HalfOpen allows was handed out; refused in any other state. */
  probeStarted(tp: TopicPartition, offset: bigint, now: number): "probe_started" {
    if (this._state !== "HalfOpen") {
      throw new IllegalTransition(`breaker: can't handle probe_started when ${this._state}`);
    }
    this.probe = { tp, offset };
    this.probeSince = now;
    return this.go("probe_started") as "probe_started";
  }

  // -- views (change nothing) --------------------------------------------------

  /** Messages that may be handed out now (`null`: no limit). */
  allowance(): bigint | null {
    switch (this._state) {
      case "Closed": return null;
      case "Open": return 0n;
      case "HalfOpen": return 1n;
      case "Probing": return 0n;
    }
  }

  /** The gate's breaker hold (§5a) is on. */
  get fetchPaused(): boolean {
    return this._state === "Open";
  }

  get closed(): boolean {
    return this._state === "Closed";
  }

  /** Seconds until it lets work out again; `null` while Closed. */
  heldFor(now: number): number | null {
    switch (this._state) {
      case "Closed": return null;
      case "Open": {
        if (this.openUntil === null) throw new Error("breaker: Open without open_until");
        const left = this.openUntil - now; // rounded
        return left > 0 ? left : 0.0; // max(0.0, left)
      }
      case "HalfOpen":
      case "Probing": return 0.0;
    }
  }

  snapshot(now: number): BreakerSnapshot {
    const { calls, failures } = this.windowCounts(now);
    return {
      state: this._state, reason: this.reason, errorClass: this.errorClass, trips: this.trips,
      backoff: this.backoff, heldFor: this.heldFor(now), streak: BigInt(this.streak.size),
      windowCalls: calls, windowFailures: failures,
    };
  }
}
