------------------------------ MODULE Consumer ------------------------------
(***************************************************************************)
(* htmqc: a Kafka consumer group committing per-partition watermarks.      *)
(*                                                                         *)
(* What is modelled                                                        *)
(*   - P partitions whose logs have gaps (compaction, transaction markers);*)
(*   - a group of C members; the coordinator assigns each partition to at  *)
(*     most one member at a time and gives every assignment a fresh epoch; *)
(*   - per member, a bounded pool of workers finishing messages out of     *)
(*     order, with failures, retries and dead-lettering (the lifecycle of  *)
(*     src/htmqc/core/lifecycle.py, same state and event names);           *)
(*   - per member and partition, the view of PartitionTracker: next,       *)
(*     processed, committed, requested and per-offset states;              *)
(*   - commits whose answers travel through a network that delays,         *)
(*     duplicates, reorders and loses them;                                *)
(*   - member crash and restart (volatile state lost, restart from the     *)
(*     durable position), session expiry leaving a zombie that still       *)
(*     believes it owns its partitions, voluntary revocation;              *)
(*   - a sink, in two MODEs:                                               *)
(*       "at-least-once": the handler stores the effect, the watermark is  *)
(*                        committed to Kafka afterwards;                   *)
(*       "exactly-once" : effects and the watermark (plus the offsets      *)
(*                        finished above it) are stored in one sink        *)
(*                        transaction fenced by the partition's epoch.     *)
(*                                                                         *)
(* What is verified (see MCConsumer.tla and tla/manifest.json)             *)
(*   TypeOK, OffsetOrder, CommittedMonotonic, NoLoss in both modes;        *)
(*   NoDuplicateEffect in exactly-once mode (TLC finds a counterexample in *)
(*   at-least-once mode: duplicates there are documented, not a bug);      *)
(*   AllFinished (liveness) under weak fairness of the non-fault actions.  *)
(*   Two mutant switches show the properties have teeth: COMMIT_NEXT       *)
(*   (commit `next` instead of the watermark) breaks NoLoss; FENCE = FALSE *)
(*   (exactly-once sink without the epoch fence) breaks NoDuplicateEffect. *)
(*                                                                         *)
(* Abstractions (spec/refinement.md has the full mapping)                  *)
(*   - a commit request reaches the broker/sink atomically with the step   *)
(*     that sends it; only the answer travels through the network;         *)
(*   - revocation is atomic (the core's draining phase is not modelled);   *)
(*   - dead-letter records are written at once, at least once (a set);     *)
(*   - effect counts saturate at 2 ("stored twice" is all we ask about).   *)
(***************************************************************************)
EXTENDS Naturals, FiniteSets

CONSTANTS
    Partitions,        \* the topic's partitions
    Members,           \* the consumer-group members
    NoMember,          \* model value: "no member owns this partition"
    Log,               \* Log[p]: the offsets present in partition p's log
    End,               \* End[p]: the log end offset of p; offsets in
                       \*   0..End[p]-1 that are not in Log[p] are gaps
    Workers,           \* messages one member may run at once
    MaxRetries,        \* retries of one offset before it must be dead-lettered
    MaxEpoch,          \* bound on assignments per partition (model size)
    MaxCrashes,        \* bound on member crashes (model size)
    MaxExpiries,       \* bound on session expiries, i.e. zombies (model size)
    TransientFailures, \* TRUE: an at-least-once commit may fail transiently
    MODE,              \* "at-least-once" or "exactly-once"
    FENCE,             \* TRUE; FALSE is a mutant: the sink takes stale epochs
    COMMIT_NEXT,       \* FALSE; TRUE is a mutant: commits hand out `next`
    FORGET_SKIP        \* FALSE; TRUE mirrors PartitionTracker.finished_above()
                       \*   as of 2026-11-22, which leaves out skipped offsets
                       \*   not fetched again yet (a duplicate, see manifest)

ALO == "at-least-once"
EOS == "exactly-once"

ASSUME /\ MODE \in {ALO, EOS}
       /\ FENCE \in BOOLEAN /\ COMMIT_NEXT \in BOOLEAN /\ FORGET_SKIP \in BOOLEAN
       /\ TransientFailures \in BOOLEAN
       /\ NoMember \notin Members
       /\ \A p \in Partitions : End[p] \in Nat /\ Log[p] \subseteq 0..(End[p] - 1)
       /\ {Workers, MaxRetries, MaxEpoch, MaxCrashes, MaxExpiries} \subseteq Nat

VARIABLES
    owner,        \* owner[p]: the member the coordinator assigned p to, or NoMember
    epoch,        \* epoch[p]: the epoch of p's current assignment (group side)
    down,         \* the members that crashed and have not restarted
    view,         \* view[m][p]: member m's PartitionTracker for p (volatile)
    net,          \* commit answers in flight (a set: duplicates, reordering)
    durable,      \* durable[p]: the committed offset (Kafka or sink transaction)
    durableAbove, \* durableAbove[p]: offsets above durable[p] the sink holds
                  \*   (exactly-once: stored with the watermark; else {})
    effects,      \* effects[p][o]: how many times o's effect was stored (max 2)
    dead,         \* dead[p]: offsets written to the dead-letter topic
    crashes,      \* crashes so far
    expiries      \* session expiries so far

vars == <<owner, epoch, down, view, net, durable, durableAbove, effects, dead,
          crashes, expiries>>

-----------------------------------------------------------------------------
(***************************************************************************)
(* Helpers                                                                 *)
(***************************************************************************)
Max(a, b) == IF a >= b THEN a ELSE b
Min(S) == CHOOSE x \in S : \A y \in S : x <= y
Bump(n) == IF n >= 2 THEN 2 ELSE n + 1

MaxEnd == CHOOSE e \in {End[p] : p \in Partitions} : \A p \in Partitions : End[p] <= e
Offsets == 0..(MaxEnd - 1)      \* a common domain for per-offset functions

\* Lifecycle states (lifecycle.MessageState values) and "None": not fetched.
Lifecycle == {"Pending", "Processing", "Succeeded", "Failed", "Retrying", "DeadLettered"}
Live == {"Pending", "Processing", "Failed", "Retrying"}
Finished == {"Succeeded", "DeadLettered"}

\* The view of a partition the member does not hold.
NoView == [held |-> FALSE, epoch |-> 0, next |-> 0, committed |-> 0,
           requested |-> 0, dirty |-> FALSE,
           st |-> [o \in Offsets |-> "None"], fails |-> [o \in Offsets |-> 0],
           skip |-> {}, pending |-> {}]

\* PartitionTracker(start = durable[p], finished_above = durableAbove[p]).
Fresh(p, e) == [held |-> TRUE, epoch |-> e, next |-> durable[p],
                committed |-> durable[p], requested |-> durable[p], dirty |-> FALSE,
                st |-> [o \in Offsets |-> "None"], fails |-> [o \in Offsets |-> 0],
                skip |-> durableAbove[p], pending |-> {}]

\* PartitionTracker.processed: the smallest unfinished fetched offset, or next.
Processed(v) == LET u == {o \in Offsets : v.st[o] \in Live}
                IN IF u = {} THEN v.next ELSE Min(u)

\* PartitionTracker.finished_above(): fetched, finished, above the watermark,
\* and the offsets the sink held at assignment that are not fetched yet (they
\* are still done: forgetting them would run them again after a restart).
FinishedAbove(v) ==
    LET w == Processed(v) IN
    {o \in Offsets : o > w /\ v.st[o] \in Finished}
    \cup (IF FORGET_SKIP THEN {} ELSE {o \in v.skip : o >= v.next})

\* The offset a commit request hands out (the mutant hands out next).
CommitOffset(v) == IF COMMIT_NEXT THEN v.next ELSE Processed(v)

Holds(m, p) == view[m][p].held
\* PartitionTracker.commit_requested hands out an offset only when it is due.
CommitDue(v) == Processed(v) > v.requested \/ v.dirty
\* The coordinator still gives m the assignment m's view belongs to.
Current(m, p) == owner[p] = m /\ epoch[p] = view[m][p].epoch
\* The broker (generation check) or the sink (epoch fence) accepts a write.
Accepted(m, p) == IF MODE = EOS /\ ~FENCE THEN TRUE ELSE Current(m, p)

Busy(m) == Cardinality({po \in Partitions \X Offsets : view[m][po[1]].st[po[2]] = "Processing"})

\* Make the commit of `off` by m for p durable: Kafka commit, or sink transaction
\* (effects buffered in the view, the watermark, the offsets finished above it).
Store(m, p, off) ==
    LET v == view[m][p] IN
    /\ durable' = [durable EXCEPT ![p] = off]
    /\ IF MODE = EOS
         THEN /\ durableAbove' = [durableAbove EXCEPT ![p] = {o \in FinishedAbove(v) : o >= off}]
              /\ effects' = [effects EXCEPT ![p] = [o \in Offsets |->
                                 IF o \in v.pending THEN Bump(effects[p][o]) ELSE effects[p][o]]]
         ELSE UNCHANGED <<durableAbove, effects>>

-----------------------------------------------------------------------------
(***************************************************************************)
(* Group membership: assign, revoked, crashed, restored, session expiry    *)
(***************************************************************************)
\* assign: the coordinator gives the free partition p to the live member m.
Assign(m, p) ==
    /\ owner[p] = NoMember /\ m \notin down /\ ~Holds(m, p)
    /\ epoch[p] < MaxEpoch
    /\ epoch' = [epoch EXCEPT ![p] = @ + 1]
    /\ owner' = [owner EXCEPT ![p] = m]
    /\ view' = [view EXCEPT ![m][p] = Fresh(p, epoch[p] + 1)]
    /\ UNCHANGED <<down, net, durable, durableAbove, effects, dead, crashes, expiries>>

\* revoked (cooperative rebalance): m gives p up; its final commit is made
\* (ConsumerCore.revoked returns it) and unfinished work is dropped.
Revoked(m, p) ==
    /\ Holds(m, p) /\ Current(m, p) /\ m \notin down
    /\ epoch[p] < MaxEpoch
    /\ IF CommitDue(view[m][p])
         THEN Store(m, p, CommitOffset(view[m][p]))
         ELSE UNCHANGED <<durable, durableAbove, effects>>
    /\ owner' = [owner EXCEPT ![p] = NoMember]
    /\ view' = [view EXCEPT ![m][p] = NoView]
    /\ UNCHANGED <<epoch, down, net, dead, crashes, expiries>>

\* revoked (partitions lost): a zombie learns that p moved on; nothing is committed.
RevokedLost(m, p) ==
    /\ Holds(m, p) /\ ~Current(m, p)
    /\ view' = [view EXCEPT ![m][p] = NoView]
    /\ UNCHANGED <<owner, epoch, down, net, durable, durableAbove, effects, dead,
                   crashes, expiries>>

\* m is paused past its session: the coordinator takes its partitions away,
\* m does not know and keeps working on them (a zombie).
SessionExpired(m) ==
    /\ expiries < MaxExpiries
    /\ \E p \in Partitions : owner[p] = m
    /\ \A p \in Partitions : owner[p] = m => epoch[p] < MaxEpoch
    /\ owner' = [p \in Partitions |-> IF owner[p] = m THEN NoMember ELSE owner[p]]
    /\ expiries' = expiries + 1
    /\ UNCHANGED <<epoch, down, view, net, durable, durableAbove, effects, dead, crashes>>

\* crashed: every volatile state of m is gone; with static membership the
\* coordinator keeps its partitions for it until its session expires.
Crashed(m) ==
    /\ m \notin down /\ crashes < MaxCrashes
    /\ \A p \in Partitions : owner[p] = m => epoch[p] < MaxEpoch
    /\ down' = down \cup {m}
    /\ view' = [view EXCEPT ![m] = [p \in Partitions |-> NoView]]
    /\ crashes' = crashes + 1
    /\ UNCHANGED <<owner, epoch, net, durable, durableAbove, effects, dead, expiries>>

\* restored: m restarts and takes its partitions again from the durable position.
Restored(m) ==
    /\ m \in down
    /\ down' = down \ {m}
    /\ epoch' = [p \in Partitions |-> IF owner[p] = m THEN epoch[p] + 1 ELSE epoch[p]]
    /\ view' = [view EXCEPT ![m] = [p \in Partitions |->
                   IF owner[p] = m THEN Fresh(p, epoch[p] + 1) ELSE NoView]]
    /\ UNCHANGED <<owner, net, durable, durableAbove, effects, dead, crashes, expiries>>

-----------------------------------------------------------------------------
(***************************************************************************)
(* Fetching and the message lifecycle (one worker runs one message)        *)
(***************************************************************************)
\* fetched: a batch covering [next, e); present offsets become Pending, those
\* the sink already holds (skip) arrive finished; missing offsets are gaps.
Fetched(m, p) ==
    LET v == view[m][p] IN
    /\ Holds(m, p) /\ v.next < End[p]
    /\ \E e \in (v.next + 1)..End[p] :
         view' = [view EXCEPT ![m][p].next = e,
                              ![m][p].st = [o \in Offsets |->
                                 IF o >= v.next /\ o < e /\ o \in Log[p]
                                 THEN IF o \in v.skip THEN "Succeeded" ELSE "Pending"
                                 ELSE v.st[o]]]
    /\ UNCHANGED <<owner, epoch, down, net, durable, durableAbove, effects, dead,
                   crashes, expiries>>

Move(m, p, o, from, to) ==
    /\ view[m][p].st[o] = from
    /\ view' = [view EXCEPT ![m][p].st[o] = to]

Started(m, p, o) ==
    /\ Busy(m) < Workers
    /\ Move(m, p, o, "Pending", "Processing")
    /\ UNCHANGED <<owner, epoch, down, net, durable, durableAbove, effects, dead,
                   crashes, expiries>>

\* succeeded: at-least-once handlers store the effect now; exactly-once ones
\* buffer it in the open sink transaction (pending).
Succeeded(m, p, o) ==
    /\ view[m][p].st[o] = "Processing"
    /\ view' = [view EXCEPT ![m][p].st[o] = "Succeeded", ![m][p].dirty = TRUE,
                            ![m][p].pending = IF MODE = EOS THEN @ \cup {o} ELSE @]
    /\ effects' = IF MODE = ALO THEN [effects EXCEPT ![p][o] = Bump(@)] ELSE effects
    /\ UNCHANGED <<owner, epoch, down, net, durable, durableAbove, dead, crashes, expiries>>

Failed(m, p, o) ==
    /\ view[m][p].st[o] = "Processing"
    /\ view' = [view EXCEPT ![m][p].st[o] = "Failed",
                            ![m][p].fails[o] = IF @ > MaxRetries THEN @ ELSE @ + 1]
    /\ UNCHANGED <<owner, epoch, down, net, durable, durableAbove, effects, dead,
                   crashes, expiries>>

RetryScheduled(m, p, o) ==
    /\ view[m][p].fails[o] <= MaxRetries
    /\ Move(m, p, o, "Failed", "Retrying")
    /\ UNCHANGED <<owner, epoch, down, net, durable, durableAbove, effects, dead,
                   crashes, expiries>>

RetryDue(m, p, o) ==
    /\ Busy(m) < Workers
    /\ Move(m, p, o, "Retrying", "Processing")
    /\ UNCHANGED <<owner, epoch, down, net, durable, durableAbove, effects, dead,
                   crashes, expiries>>

DeadLettered(m, p, o) ==
    /\ view[m][p].st[o] = "Failed"
    /\ view' = [view EXCEPT ![m][p].st[o] = "DeadLettered", ![m][p].dirty = TRUE]
    /\ dead' = [dead EXCEPT ![p] = @ \cup {o}]
    /\ UNCHANGED <<owner, epoch, down, net, durable, durableAbove, effects, crashes, expiries>>

-----------------------------------------------------------------------------
(***************************************************************************)
(* Commits and their answers                                               *)
(***************************************************************************)
Answer(m, p, off, ok) == [member |-> m, part |-> p, epoch |-> view[m][p].epoch,
                          off |-> off, ok |-> ok]

\* commit_requested: hand out the watermark when it moved or something finished
\* out of order since the last request; the broker/sink takes it (if not
\* fenced) and its answer goes into the network.
CommitRequested(m, p) ==
    LET v == view[m][p]
        off == CommitOffset(v) IN
    /\ Holds(m, p)
    /\ CommitDue(v)
    /\ view' = [view EXCEPT ![m][p].requested = off, ![m][p].dirty = FALSE,
                            ![m][p].pending = {}]
    /\ \/ /\ Accepted(m, p)
          /\ Store(m, p, off)
          /\ net' = net \cup {Answer(m, p, off, TRUE)}
       \/ /\ ~Accepted(m, p) \/ (TransientFailures /\ MODE = ALO)
          /\ net' = net \cup {Answer(m, p, off, FALSE)}
          /\ UNCHANGED <<durable, durableAbove, effects>>
    /\ UNCHANGED <<owner, epoch, down, dead, crashes, expiries>>

\* commit_acked: an answer arrives; late (stale epoch) or duplicated (at or
\* below committed) answers change nothing. keep = TRUE leaves a copy in the
\* network, which is how an answer gets duplicated.
AckDelivered(m, p, msg, keep) ==
    LET v == view[m][p] IN
    /\ msg.member = m /\ msg.part = p /\ msg.ok
    /\ net' = IF keep THEN net ELSE net \ {msg}
    /\ IF v.held /\ v.epoch = msg.epoch /\ msg.off > v.committed
         THEN view' = [view EXCEPT ![m][p].committed = msg.off,
                                   ![m][p].requested = Max(@, msg.off)]
         ELSE UNCHANGED view
    /\ UNCHANGED <<owner, epoch, down, durable, durableAbove, effects, dead,
                   crashes, expiries>>

CommitAcked(m, p) == \E msg \in net : AckDelivered(m, p, msg, FALSE)
AckDuplicated(m, p) == \E msg \in net : AckDelivered(m, p, msg, TRUE)

\* commit_failed: the next commit_requested asks again (if not late).
CommitFailed(m, p) ==
    \E msg \in net :
      /\ msg.member = m /\ msg.part = p /\ ~msg.ok
      /\ net' = net \ {msg}
      /\ IF view[m][p].held /\ view[m][p].epoch = msg.epoch
           THEN view' = [view EXCEPT ![m][p].requested = view[m][p].committed,
                                     ![m][p].dirty = TRUE]
           ELSE UNCHANGED view
      /\ UNCHANGED <<owner, epoch, down, durable, durableAbove, effects, dead,
                     crashes, expiries>>

\* The network loses an answer.
AnswerLost ==
    /\ \E msg \in net : net' = net \ {msg}
    /\ UNCHANGED <<owner, epoch, down, view, durable, durableAbove, effects, dead,
                   crashes, expiries>>

-----------------------------------------------------------------------------
(***************************************************************************)
(* The specification                                                       *)
(***************************************************************************)
Init ==
    /\ owner = [p \in Partitions |-> NoMember]
    /\ epoch = [p \in Partitions |-> 0]
    /\ down = {}
    /\ view = [m \in Members |-> [p \in Partitions |-> NoView]]
    /\ net = {}
    /\ durable = [p \in Partitions |-> 0]
    /\ durableAbove = [p \in Partitions |-> {}]
    /\ effects = [p \in Partitions |-> [o \in Offsets |-> 0]]
    /\ dead = [p \in Partitions |-> {}]
    /\ crashes = 0
    /\ expiries = 0

\* The steps of member m that make progress (the fair ones).
Progress(m) ==
    \E p \in Partitions :
       \/ Fetched(m, p)
       \/ CommitRequested(m, p) \/ CommitAcked(m, p) \/ CommitFailed(m, p)
       \/ RevokedLost(m, p)
       \/ \E o \in Offsets :
             \/ Started(m, p, o) \/ Succeeded(m, p, o) \/ RetryScheduled(m, p, o)
             \/ RetryDue(m, p, o) \/ DeadLettered(m, p, o)

\* Faults and scheduling choices: never required to happen.
Faults(m) ==
    \/ Crashed(m) \/ SessionExpired(m)
    \/ \E p \in Partitions :
          \/ Revoked(m, p) \/ AckDuplicated(m, p)
          \/ \E o \in Offsets : Failed(m, p, o)

Next ==
    \/ \E m \in Members : Progress(m) \/ Faults(m) \/ Restored(m)
    \/ \E m \in Members, p \in Partitions : Assign(m, p)
    \/ AnswerLost

Fairness ==
    /\ \A m \in Members : WF_vars(Progress(m)) /\ WF_vars(Restored(m))
    /\ \A p \in Partitions : WF_vars(\E m \in Members : Assign(m, p))

Spec == Init /\ [][Next]_vars /\ Fairness

-----------------------------------------------------------------------------
(***************************************************************************)
(* Properties                                                              *)
(***************************************************************************)
ViewType == [held : BOOLEAN, epoch : 0..MaxEpoch, next : 0..MaxEnd,
             committed : 0..MaxEnd, requested : 0..MaxEnd, dirty : BOOLEAN,
             st : [Offsets -> Lifecycle \cup {"None"}],
             fails : [Offsets -> 0..(MaxRetries + 1)],
             skip : SUBSET Offsets, pending : SUBSET Offsets]

TypeOK ==
    /\ owner \in [Partitions -> Members \cup {NoMember}]
    /\ epoch \in [Partitions -> 0..MaxEpoch]
    /\ down \subseteq Members
    /\ view \in [Members -> [Partitions -> ViewType]]
    /\ net \subseteq [member : Members, part : Partitions, epoch : 0..MaxEpoch,
                      off : 0..MaxEnd, ok : BOOLEAN]
    /\ durable \in [Partitions -> 0..MaxEnd]
    /\ durableAbove \in [Partitions -> SUBSET Offsets]
    /\ effects \in [Partitions -> [Offsets -> 0..2]]
    /\ dead \in [Partitions -> SUBSET Offsets]
    /\ crashes \in 0..MaxCrashes /\ expiries \in 0..MaxExpiries

\* OffsetOrder: the PartitionTracker invariant, in every member's view
\* (committed <= requested <= processed <= next; live offsets below next).
OffsetOrder ==
    \A m \in Members, p \in Partitions :
       LET v == view[m][p] IN
       v.held =>
          /\ v.committed <= v.requested
          /\ v.requested <= Processed(v)
          /\ Processed(v) <= v.next
          /\ \A o \in Offsets : v.st[o] \in Live => o < v.next

\* CommittedMonotonic: the durable position never moves backwards.
CommittedMonotonic == [][\A p \in Partitions : durable'[p] >= durable[p]]_vars

\* NoLoss: every offset the durable position says is done (below it, or stored
\* above it) has its effect stored or is dead-lettered; gaps need nothing.
NoLoss ==
    \A p \in Partitions : \A o \in Log[p] :
       (o < durable[p] \/ o \in durableAbove[p]) => (effects[p][o] >= 1 \/ o \in dead[p])

\* NoDuplicateEffect: no offset's effect is stored twice, across crashes,
\* rebalances and zombies (holds in exactly-once mode only).
NoDuplicateEffect == \A p \in Partitions : \A o \in Offsets : effects[p][o] <= 1

\* AllFinished (liveness): every partition's durable position reaches its log
\* end, so every message is finished and its completion is durable.
AllFinished == \A p \in Partitions : <>(durable[p] = End[p])

=============================================================================
