// The partition gate, ported from spec/README.md §5a (and GateTable in
// tla/Consumer.tla). Times are doubles; offsets are bigint. No clock, no I/O.

import { IllegalTransition, TopicPartition } from "./core";

export type GateState =
  | "Unassigned" | "Claiming" | "Active" | "Waiting" | "Fenced" | "Reclaiming" | "Draining" | "Leaving";
export type GateEvent =
  | "assigned" | "claimed" | "retry_wait" | "retry_wait_over" | "fenced" | "rolled_back"
  | "fence_grace_over" | "revoking" | "revoked" | "lost";
export type Hold = "flow" | "breaker";

/** TRANSITIONS[state][event] -> state (§5a); a missing entry is illegal. */
const TABLE: Record<GateState, Partial<Record<GateEvent, GateState>>> = {
  Unassigned: { assigned: "Claiming" },
  Claiming: { claimed: "Active", fenced: "Claiming", rolled_back: "Claiming", revoking: "Leaving", lost: "Unassigned" },
  Active: {
    assigned: "Claiming", retry_wait: "Waiting", fenced: "Fenced", rolled_back: "Reclaiming",
    revoking: "Draining", lost: "Unassigned",
  },
  Waiting: {
    assigned: "Claiming", retry_wait: "Waiting", retry_wait_over: "Active", fenced: "Fenced",
    rolled_back: "Reclaiming", revoking: "Draining", lost: "Unassigned",
  },
  Fenced: {
    assigned: "Claiming", fenced: "Fenced", rolled_back: "Fenced", fence_grace_over: "Reclaiming",
    revoking: "Leaving", lost: "Unassigned",
  },
  Reclaiming: { claimed: "Active", fenced: "Reclaiming", rolled_back: "Reclaiming", revoking: "Leaving", lost: "Unassigned" },
  Draining: { fenced: "Leaving", rolled_back: "Leaving", revoked: "Unassigned", lost: "Unassigned" },
  Leaving: { fenced: "Leaving", rolled_back: "Leaving", revoked: "Unassigned", lost: "Unassigned" },
};
const HELD: ReadonlySet<GateState> = new Set<GateState>(["Active", "Waiting", "Draining"]);
const CLAIMS: ReadonlySet<GateState> = new Set<GateState>(["Claiming", "Reclaiming"]);

export type GateAction =
  | { type: "Drop" | "Claim" | "Pause" | "Resume"; tps: TopicPartition[] }
  | { type: "Seek"; tp: TopicPartition; offset: bigint };

export interface GatePart {
  state: GateState;
  paused: boolean | null;
  since: number | null;
  until: number | null;
}

interface Move { tp: TopicPartition; event: GateEvent; offset: bigint | null }

export class Gate {
  private readonly parts = new Map<string, { tp: TopicPartition; part: GatePart }>();
  private readonly holdSet = new Set<Hold>();

  constructor(readonly fenceGrace: number) {}

  state(tp: TopicPartition): GateState {
    return this.parts.get(tp.toString())?.part.state ?? "Unassigned";
  }

  assigned(tps: TopicPartition[]): GateAction[] {
    return this.move(tps.map((tp) => ({ tp, event: "assigned", offset: null })));
  }

  claimed(positions: [TopicPartition, bigint][]): GateAction[] {
    return this.move(positions.map(([tp, offset]) => ({ tp, event: "claimed", offset })));
  }

  retryWait(tp: TopicPartition, offset: bigint, until: number): GateAction[] {
    return this.move([{ tp, event: "retry_wait", offset }], null, until);
  }

  rolledBack(stale: TopicPartition[], now: number): GateAction[] {
    const fenced = new Set(stale.map((tp) => tp.toString()));
    return this.move(
      [...this.parts.values()].map(({ tp }) => ({
        tp, event: fenced.has(tp.toString()) ? "fenced" : "rolled_back", offset: null,
      })),
      now,
    );
  }

  tick(now: number): GateAction[] {
    const moves: Move[] = [];
    for (const { tp, part } of this.parts.values()) {
      if (part.state === "Fenced" && part.since !== null && now - part.since >= this.fenceGrace) {
        moves.push({ tp, event: "fence_grace_over", offset: null });
      } else if (part.state === "Waiting" && part.until !== null && part.until <= now) {
        moves.push({ tp, event: "retry_wait_over", offset: null });
      }
    }
    return moves.length > 0 ? this.move(moves) : [];
  }

  revoking(tps: TopicPartition[]): GateAction[] {
    return this.move(tps.map((tp) => ({ tp, event: "revoking", offset: null })));
  }

  revoked(tps: TopicPartition[]): GateAction[] {
    return this.move(tps.map((tp) => ({ tp, event: "revoked", offset: null })));
  }

  lost(tps: TopicPartition[]): GateAction[] {
    return this.move(
      tps.filter((tp) => this.parts.has(tp.toString())).map((tp) => ({ tp, event: "lost", offset: null })),
    );
  }

  hold(reason: Hold): GateAction[] {
    this.holdSet.add(reason);
    return this.sync([...this.parts.values()].map(({ tp }) => tp), [], []);
  }

  unhold(reason: Hold): GateAction[] {
    this.holdSet.delete(reason);
    return this.sync([...this.parts.values()].map(({ tp }) => tp), [], []);
  }

  snapshot(): { holds: Hold[]; partitions: Map<string, GatePart> } {
    return {
      holds: [...this.holdSet].sort(),
      partitions: new Map([...this.parts].map(([name, { part }]) => [name, { ...part }])),
    };
  }

  // -- the one place that moves partitions (§5a) --------------------------------

  private move(all: Move[], since: number | null = null, until: number | null = null): GateAction[] {
    const seen = new Set<string>();
    const moves = all.filter((m) => !seen.has(m.tp.toString()) && seen.add(m.tp.toString()) !== undefined);
    for (const m of moves) {
      const state = this.state(m.tp);
      if (TABLE[state][m.event] === undefined) {
        throw new IllegalTransition(`gate: can't handle ${m.event} when ${m.tp.toString()} is ${state}`);
      }
    }
    const drops: TopicPartition[] = [];
    const claims: TopicPartition[] = [];
    const seeks: GateAction[] = [];
    for (const m of moves) {
      const name = m.tp.toString();
      const part: GatePart = this.parts.get(name)?.part ?? { state: "Unassigned", paused: null, since: null, until: null };
      const source = part.state;
      const target = TABLE[source][m.event]!;
      if (HELD.has(source) && !HELD.has(target)) drops.push(m.tp);
      if (CLAIMS.has(target) && !CLAIMS.has(source)) claims.push(m.tp);
      const seeking = (m.event === "retry_wait" && (source === "Active" || source === "Waiting"))
        || (m.event === "claimed" && source === "Reclaiming");
      if (seeking && m.offset !== null) seeks.push({ type: "Seek", tp: m.tp, offset: m.offset });
      if (m.event === "assigned") part.paused = null;
      part.state = target;
      if (target !== "Fenced") part.since = null;
      else if (source !== "Fenced") part.since = since;
      part.until = target === "Waiting" ? until : null;
      if (target === "Unassigned") this.parts.delete(name);
      else this.parts.set(name, { tp: m.tp, part });
    }
    const actions: GateAction[] = [];
    if (drops.length > 0) actions.push({ type: "Drop", tps: drops });
    if (claims.length > 0) actions.push({ type: "Claim", tps: claims });
    return this.sync(moves.map((m) => m.tp), actions, seeks);
  }

  /** Pause or Resume where the wanted pause differs from what Kafka was told. */
  private sync(tps: TopicPartition[], actions: GateAction[], seeks: GateAction[]): GateAction[] {
    const pause: TopicPartition[] = [];
    const resume: TopicPartition[] = [];
    for (const tp of tps) {
      const part = this.parts.get(tp.toString())?.part;
      if (part === undefined) continue;
      const want = part.state === "Waiting" || part.state === "Fenced" ? true
        : part.state === "Active" ? this.holdSet.size > 0 : null;
      if (want === null || part.paused === want) continue;
      (want ? pause : resume).push(tp);
      part.paused = want;
    }
    if (pause.length > 0) actions.push({ type: "Pause", tps: pause });
    actions.push(...seeks);
    if (resume.length > 0) actions.push({ type: "Resume", tps: resume });
    return actions;
  }
}
