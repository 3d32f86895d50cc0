// The failure decision, ported from spec/README.md §4b (and §4 for the
// backoff) and the failure-decision vectors alone; no Python was read.
//
// `decide` is a pure function: no state, no clock, no random draw. Offsets,
// epochs and attempt counts are `bigint`; times, jitter, delays are IEEE-754
// doubles (`number`), each `now + x` one rounded addition.

import { FailureKind, RetryAt, RetryPolicy, TopicPartition } from "./core";

/** A failure and the runtime's facts about it (§4b, "Inputs"). */
export class Failure {
  readonly kind: FailureKind;
  /** The poison detector's verdict (too many fast failures). */
  readonly poison: boolean;
  /** The handler raised something that would kill its worker. */
  readonly fatal: boolean;
  /** The value is over the size limit; the handler never ran. */
  readonly tooLarge: boolean;
  /** The message was read from the retry topic. */
  readonly fromRetryTopic: boolean;
  /** Failures recorded on that retry-topic record (0 when it has none). */
  readonly priorAttempts: bigint;

  constructor(f: {
    kind: FailureKind; poison?: boolean; fatal?: boolean; tooLarge?: boolean;
    fromRetryTopic?: boolean; priorAttempts?: bigint;
  }) {
    const prior = f.priorAttempts ?? 0n;
    const fromRetryTopic = f.fromRetryTopic ?? false;
    if (f.kind !== "retryable" && f.kind !== "unknown" && f.kind !== "permanent") {
      throw new RangeError(`bad failure kind ${JSON.stringify(f.kind)}`);
    }
    if (prior < 0n) throw new RangeError(`prior_attempts must be >= 0, got ${prior}`);
    // §4b: "a failure with prior_attempts > 0 and from_retry_topic false is
    // refused when built".
    if (prior > 0n && !fromRetryTopic) {
      throw new RangeError("prior_attempts > 0 needs from_retry_topic");
    }
    this.kind = f.kind;
    this.poison = f.poison ?? false;
    this.fatal = f.fatal ?? false;
    this.tooLarge = f.tooLarge ?? false;
    this.fromRetryTopic = fromRetryTopic;
    this.priorAttempts = prior;
  }
}

/** `--retry-topic`: its name, the shortest backoff that waits there, and with
 * several source topics each one's own retry topic (`per_source`, §4b). */
export interface RetryTopic {
  readonly name: string;
  /** Seconds, a double ≥ 0. */
  readonly minDelay: number;
  /** `[source, retry]` pairs; empty for one source topic. */
  readonly perSource: ReadonlyArray<readonly [string, string]>;
}

/** A retry topic, refused unless its names are not empty, `min_delay ≥ 0`, and
 * each source has its own retry topic that is not also a source. */
export function retryTopic(
  name: string, minDelay: number, perSource: ReadonlyArray<readonly [string, string]> = [],
): RetryTopic {
  if (name === "" || perSource.some(([s, r]) => s === "" || r === "")) {
    throw new RangeError("the retry topic needs a name");
  }
  if (!(minDelay >= 0)) throw new RangeError(`min_delay must be >= 0, got ${minDelay}`);
  const sources = new Set(perSource.map(([s]) => s));
  const retries = new Set(perSource.map(([, r]) => r));
  if (sources.size !== perSource.length || retries.size !== perSource.length) {
    throw new RangeError("each source topic needs its own retry topic");
  }
  if ([...retries].some((r) => sources.has(r))) {
    throw new RangeError("a retry topic cannot also be a source topic");
  }
  return { name, minDelay, perSource };
}

/** §4b row 6: the retry topic of the pair naming `topic` as source or retry, else `name`. */
export function forSource(rt: RetryTopic, topic: string): string {
  const pair = rt.perSource.find(([s, r]) => topic === s || topic === r);
  return pair === undefined ? rt.name : pair[1];
}

export type DeadLetterKind = "too_large" | "poison" | "permanent" | "failed";

/** The core's own `RetryAt`; `attempt` is the whole `attempts`. */
export type FailureRetryAt = RetryAt;

export interface FailureDeadLetter {
  readonly type: "DeadLetter";
  readonly tp: TopicPartition;
  readonly epoch: bigint;
  readonly offset: bigint;
  /** The whole `attempts`. */
  readonly attempts: bigint;
  readonly kind: DeadLetterKind;
}

export interface HandOff {
  readonly type: "HandOff";
  readonly tp: TopicPartition;
  readonly epoch: bigint;
  readonly offset: bigint;
  /** The retry topic's name. */
  readonly topic: string;
  /** The whole `attempts`. */
  readonly attempt: bigint;
  /** `now + d`. */
  readonly due: number;
}

export type FailureDecision = FailureRetryAt | FailureDeadLetter | HandOff;

export interface DecideInput {
  readonly tp: TopicPartition;
  readonly epoch: bigint;
  readonly offset: bigint;
  readonly failure: Failure;
  /** Every failure of the message: this assignment's count plus `prior_attempts`. */
  readonly attempts: bigint;
  readonly retry: RetryPolicy;
  readonly retryTopic: RetryTopic | null;
  readonly now: number;
  /** In [0, 1]. */
  readonly jitter: number;
  /** `null` while the breaker is Closed, else its `held_for(now)` (`0.0` is a hold). */
  readonly heldFor: number | null;
}

/** The failure decision of spec §4b: the first rule whose fact holds. */
export function decide(x: DecideInput): FailureDecision {
  const { tp, epoch, offset, failure, attempts, retry, retryTopic, now, jitter, heldFor } = x;
  // Inputs outside the domain are caller bugs (§4b); refused here, changing nothing.
  if (attempts < 1n || attempts <= failure.priorAttempts) {
    throw new RangeError(`attempts must be >= 1 and > prior_attempts, got ${attempts}`);
  }
  if (failure.fromRetryTopic && retryTopic === null) {
    throw new RangeError("from_retry_topic needs a retry topic");
  }
  if (!(jitter >= 0 && jitter <= 1)) throw new RangeError(`jitter must be in [0, 1], got ${jitter}`);
  if (heldFor !== null && !(heldFor >= 0)) throw new RangeError(`held_for must be >= 0, got ${heldFor}`);

  // Facts (§4b). d is the backoff of the whole attempts (§4), computed
  // whether or not it is used.
  const d = retry.delay(attempts, jitter);
  const tooLarge = failure.tooLarge;
  const poison = failure.poison || failure.fatal;
  const permanent = failure.kind === "permanent";
  const spent = attempts > retry.maxRetries;
  // Doubles compared exactly: d equal to min_delay hands off.
  const toTopic = retryTopic !== null && (failure.fromRetryTopic || d >= retryTopic.minDelay);

  // Rules, in priority order: the first fact that holds decides.
  const dead = (kind: DeadLetterKind): FailureDeadLetter =>
    ({ type: "DeadLetter", tp, epoch, offset, attempts, kind });
  if (tooLarge) return dead("too_large"); // 1
  if (heldFor !== null) return { type: "RetryAt", tp, epoch, offset, attempt: attempts, at: now + heldFor }; // 2
  if (poison) return dead("poison"); // 3
  if (permanent) return dead("permanent"); // 4
  if (spent) return dead("failed"); // 5
  if (toTopic) return { type: "HandOff", tp, epoch, offset, topic: forSource(retryTopic, tp.topic), attempt: attempts, due: now + d }; // 6
  return { type: "RetryAt", tp, epoch, offset, attempt: attempts, at: now + d }; // 7
}
