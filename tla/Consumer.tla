------------------------------ MODULE Consumer ------------------------------
(***************************************************************************)
(* htmqc: a Kafka consumer group committing per-partition watermarks.      *)
(*                                                                         *)
(* What is modelled                                                        *)
(*   - P partitions whose logs have gaps (compaction, transaction markers);*)
(*   - a group of C members; the coordinator assigns each partition to at  *)
(*     most one member at a time;                                          *)
(*   - per member, a bounded pool of workers running handlers; each        *)
(*     running handler is tagged with the epoch of the claim it was        *)
(*     started under and outlives revocation, so a member that claimed a   *)
(*     partition again can hear its old work finish: the core ignores it;  *)
(*   - the message lifecycle of src/htmqc/core/lifecycle.py, and what      *)
(*     becomes of a failure as src/htmqc/core/failures.py decides it: the  *)
(*     rule table FailureRules over facts, some chosen freely per failure  *)
(*     (too large, poison, permanent, a long backoff), the others read off *)
(*     the state (the breaker holds, the retries are spent, the record     *)
(*     came from the retry topic); a dead letter of a kind, a retry in     *)
(*     memory, or a hand-off to the retry topic, which finishes the offset *)
(*     in its partition (HandedOff) and appends a record to the retry      *)
(*     topic's partition, consumed by the same group;                      *)
(*   - per member and partition, the view of PartitionTracker: next,       *)
(*     processed, committed, requested, unsent (something finished since   *)
(*     the last commit request), per-offset states and the offsets the     *)
(*     sink held at assignment (skip);                                     *)
(*   - per member and partition, the gate of src/htmqc/core/gate.py        *)
(*     (GateTable, the same states and events) with what it last told      *)
(*     Kafka, and Kafka's own pause flag, which librdkafka keeps across    *)
(*     unassign and assign; per member the consumer-wide holds (flow       *)
(*     control, the circuit breaker). The runtime carries out the gate's   *)
(*     actions in the step that asked for them: Drop (the core forgets the *)
(*     partition), Claim (a fresh fence token and the durable position,    *)
(*     then claimed), Pause/Resume (Kafka's flag), Seek;                   *)
(*   - commits whose answers travel through a network that delays,         *)
(*     duplicates, reorders and loses them;                                *)
(*   - member crash and restart (volatile state and running work lost,     *)
(*     restart from the durable position), session expiry leaving a zombie *)
(*     that still believes it owns its partitions, cooperative revocation  *)
(*     (revoking: the core drains; revoked: the final commit), a claim by  *)
(*     a process the group does not know (a racing claim);                 *)
(*   - a sink, in two MODEs:                                               *)
(*       "at-least-once": the handler stores the effect, the watermark and *)
(*                        the offsets finished above it are committed to   *)
(*                        Kafka afterwards (commit metadata), accepted     *)
(*                        only from the partition's current owner (the     *)
(*                        broker's generation check);                      *)
(*       "exactly-once" : effects, the watermark and the offsets finished  *)
(*                        above it are stored in one sink transaction. The *)
(*                        sink keeps a fence token per partition; every    *)
(*                        claim (assignment, restart, reclaim) bumps it,   *)
(*                        the member keeps the token it got, a transaction *)
(*                        carries that token and the sink refuses a stale  *)
(*                        one: the transaction rolls back and the gate     *)
(*                        fences the partition (rolled_back).              *)
(*                                                                         *)
(* What is verified (see MCConsumer.tla and tla/manifest.json)             *)
(*   TypeOK, OffsetOrder, WorkTagged, OneTokenHolder, CommittedMonotonic,  *)
(*   NoLoss, CoreHoldsHeld, NoStrayPause, ToldTruth in both modes;         *)
(*   NoDuplicateEffect in exactly-once mode (TLC finds a counterexample in *)
(*   at-least-once mode: duplicates there are documented, not a bug);      *)
(*   AllFinished and AssignedResumed (liveness) under the fairness of      *)
(*   Fairness below. Mutant switches show the properties have teeth:       *)
(*   COMMIT_NEXT (commit `next`) breaks NoLoss; FENCE = FALSE (the sink    *)
(*   takes a stale token) breaks NoDuplicateEffect; EPOCH_CHECK = FALSE    *)
(*   (the core takes an event of an earlier claim) breaks NoLoss;          *)
(*   FORGET_SKIP (finished_above() as of 2026-11-22) breaks                *)
(*   NoDuplicateEffect; RECLAIM = FALSE (a fenced partition is never       *)
(*   claimed again, before commit 3bdd90a) breaks AssignedResumed;         *)
(*   EXPLICIT_PAUSE = FALSE (after an assignment the gate takes the        *)
(*   partition for resumed, before commit 44915de) breaks NoStrayPause.    *)
(*                                                                         *)
(* The state graph of the small models is also replayed edge by edge       *)
(* through the real htmqc.core: ConsumerCore, Gate and failures.decide     *)
(* (model_checks/graph_replay.py); the mapping is spec/refinement.md, in   *)
(* code model_checks/refinement.py.                                        *)
(*                                                                         *)
(* Abstractions (spec/refinement.md)                                       *)
(*   - a commit request reaches the broker/sink atomically with the step   *)
(*     that sends it; only the answer travels through the network (an      *)
(*     exactly-once refusal is known at once: the sink raises Fenced);     *)
(*   - a Claim is carried out in the step that asks for it (the runtime    *)
(*     claims inside the callback or turn that asked), so Claiming and     *)
(*     Reclaiming are passed through within a step;                        *)
(*   - time is not modelled: the fence grace may end at any moment after   *)
(*     a partition was fenced, a retry-topic record may become due at any  *)
(*     moment after it was written;                                        *)
(*   - the circuit breaker is Closed or not (Open): while not Closed it    *)
(*     holds fetching and starts nothing, and failures are held; a trip is *)
(*     a fault, its end (cooled down, a probe succeeded) a fair step;      *)
(*   - flow control holds fetching while the member's in-flight offsets    *)
(*     reach FlowWindow;                                                   *)
(*   - dead-letter and retry-topic records are written at once, at least  *)
(*     once; effect counts saturate at 2 ("stored twice" is all we ask).   *)
(***************************************************************************)
EXTENDS Naturals, FiniteSets, Sequences

CONSTANTS
    Partitions,        \* the partitions the group consumes (the retry topic's too)
    Members,           \* the consumer-group members
    NoMember,          \* model value: "no member owns this partition"
    Log,               \* Log[p]: the offsets present in data partition p's log
    End,               \* End[p]: the log end offset of data partition p; offsets
                       \*   in 0..End[p]-1 that are not in Log[p] are gaps
    Workers,           \* handlers one member may run at once
    MaxRetries,        \* retries of one message before it must be dead-lettered
    MaxEpoch,          \* bound on claims per partition (model size)
    MaxCrashes,        \* bound on member crashes (model size)
    MaxExpiries,       \* bound on session expiries, i.e. zombies (model size)
    MaxRaces,          \* bound on racing claims by unknown processes (model size)
    MaxTrips,          \* bound on circuit-breaker trips (0: it never opens)
    FlowWindow,        \* in-flight offsets at which flow control holds (0: off)
    TransientFailures, \* TRUE: an at-least-once commit may fail transiently
    RetryTopic,        \* TRUE: --retry-topic (at-least-once only)
    RetryPartition,    \* the retry topic's partition (in Partitions iff RetryTopic)
    RetryCap,          \* bound on records written to the retry topic (model size)
    FailureFacts,      \* the facts a failure may have, chosen freely per failure:
                       \*   a subset of {"too_large", "poison", "permanent", "long"}
    MODE,              \* "at-least-once" or "exactly-once"
    FENCE,             \* TRUE; FALSE is a mutant: the sink takes stale tokens
    EPOCH_CHECK,       \* TRUE; FALSE is a mutant: the core takes events of an
                       \*   earlier claim as current
    COMMIT_NEXT,       \* FALSE; TRUE is a mutant: commits hand out `next`
    FORGET_SKIP,       \* FALSE; TRUE mirrors PartitionTracker.finished_above()
                       \*   as of 2026-11-22, which leaves out skipped offsets
                       \*   not fetched again yet (a duplicate, see manifest)
    RECLAIM,           \* TRUE; FALSE is a mutant: a fenced partition is never
                       \*   claimed again (before commit 3bdd90a)
    EXPLICIT_PAUSE     \* TRUE; FALSE is a mutant: after an assignment the gate
                       \*   takes the partition for resumed, though librdkafka
                       \*   kept its pause (before commit 44915de)

ALO == "at-least-once"
EOS == "exactly-once"

\* The partitions whose logs are given (all but the retry topic's).
Data == Partitions \ {RetryPartition}

ASSUME /\ MODE \in {ALO, EOS}
       /\ FENCE \in BOOLEAN /\ EPOCH_CHECK \in BOOLEAN
       /\ COMMIT_NEXT \in BOOLEAN /\ FORGET_SKIP \in BOOLEAN
       /\ RECLAIM \in BOOLEAN /\ EXPLICIT_PAUSE \in BOOLEAN
       /\ TransientFailures \in BOOLEAN /\ RetryTopic \in BOOLEAN
       /\ RetryTopic => MODE = ALO
       /\ (RetryPartition \in Partitions) = RetryTopic
       /\ FailureFacts \subseteq {"too_large", "poison", "permanent", "long"}
       /\ NoMember \notin Members
       /\ \A p \in Data : End[p] \in Nat /\ Log[p] \subseteq 0..(End[p] - 1)
       /\ {Workers, MaxRetries, MaxEpoch, MaxCrashes, MaxExpiries, MaxRaces,
           MaxTrips, FlowWindow, RetryCap} \subseteq Nat

VARIABLES
    owner,        \* owner[p]: the member the coordinator assigned p to, or NoMember
    epoch,        \* epoch[p]: claims of p so far (assignment, restart, reclaim);
                  \*   each claim's number tags the claimer's view and work
    fence,        \* fence[p]: the sink's fence token for p (exactly-once; else 0)
    down,         \* the members that crashed and have not restarted
    view,         \* view[m][p]: member m's PartitionTracker for p (volatile)
    work,         \* work[m]: m's running handlers, [p, o, epoch started under]
    net,          \* commit answers in flight (a set: duplicates, reordering)
    durable,      \* durable[p]: the committed offset (Kafka or sink transaction)
    durableAbove, \* durableAbove[p]: offsets above durable[p] stored as finished
                  \*   with it (sink column, or Kafka commit metadata)
    effects,      \* effects[p][o]: how many times o's effect was stored (max 2)
    dead,         \* dead[p]: offsets written to the dead-letter topic
    crashes,      \* crashes so far
    expiries,     \* session expiries so far
    gate,         \* gate[m][p]: m's gate state of p (gate.GateState values)
    told,         \* told[m][p]: what m's gate last told Kafka: "paused",
                  \*   "resumed", or "unknown" (Gate._Part.paused)
    kpaused,      \* kpaused[m][p]: librdkafka's pause flag of p in m's process
    holds,        \* holds[m]: m's consumer-wide holds, "FLOW" and "BREAKER"
    breaker,      \* breaker[m]: "Closed" or "Open" (not Closed)
    trips,        \* circuit-breaker trips so far
    races,        \* racing claims so far
    rlog,         \* the retry topic's log: records [p, o, attempt] of the
                  \*   source message (its partition and offset) and its failures
    rdue          \* the offsets of rlog whose record is due

vars == <<owner, epoch, fence, down, view, work, net, durable, durableAbove,
          effects, dead, crashes, expiries, gate, told, kpaused, holds, breaker,
          trips, races, rlog, rdue>>
\* The gate's part, and the retry topic's.
gateVars == <<gate, told, kpaused, holds, breaker, trips, races>>
retryVars == <<rlog, rdue>>

-----------------------------------------------------------------------------
(***************************************************************************)
(* Helpers                                                                 *)
(***************************************************************************)
Max(a, b) == IF a >= b THEN a ELSE b
Min(S) == CHOOSE x \in S : \A y \in S : x <= y
Bump(n) == IF n >= 2 THEN 2 ELSE n + 1

MaxEnd == LET ends == {End[p] : p \in Data} \cup {IF RetryTopic THEN RetryCap ELSE 0}
          IN CHOOSE e \in ends : \A f \in ends : f <= e
Offsets == 0..(MaxEnd - 1)      \* a common domain for per-offset functions

\* The log of p: given for data partitions, written by hand-offs for the retry topic.
EndOf(p) == IF p = RetryPartition THEN Len(rlog) ELSE End[p]
LogOf(p) == IF p = RetryPartition THEN 0..(Len(rlog) - 1) ELSE Log[p]

\* The message offset o of p stands for: itself, or for a retry-topic record
\* the message it carries.
Src(p, o) == IF p = RetryPartition THEN [p |-> rlog[o + 1].p, o |-> rlog[o + 1].o]
             ELSE [p |-> p, o |-> o]
\* Failures recorded on a retry-topic record (prior_attempts), else 0.
Prior(p, o) == IF p = RetryPartition THEN rlog[o + 1].attempt ELSE 0

\* Lifecycle states (lifecycle.MessageState values) and "None": not fetched.
Lifecycle == {"Pending", "Processing", "Succeeded", "Failed", "Retrying",
              "DeadLettered", "HandedOff"}
Live == {"Pending", "Processing", "Failed", "Retrying"}
Finished == {"Succeeded", "DeadLettered", "HandedOff"}

-----------------------------------------------------------------------------
(***************************************************************************)
(* What becomes of a failure (core/failures.py RULES)                      *)
(***************************************************************************)
\* In priority order: the first fact that holds decides; none: retry.
FailureRules == <<"too_large", "held", "poison", "permanent", "spent", "to_topic">>
\* Outcomes that write a dead letter (named after their fact; "spent" is the
\* kind "failed"), that retry in memory, that hand off to the retry topic.
DeadLetterOutcomes == {"too_large", "poison", "permanent", "spent"}
RetryOutcomes == {"held", "retry"}

Outcome(facts) ==
    LET hit == {i \in 1..Len(FailureRules) : FailureRules[i] \in facts}
    IN IF hit = {} THEN "retry" ELSE FailureRules[Min(hit)]

\* The facts of the attempts-th failure of offset o of p at member m, with the
\* freely chosen facts f.
FactsOf(f, m, p, attempts) ==
    (f \ {"long"})
    \cup (IF breaker[m] # "Closed" THEN {"held"} ELSE {})
    \cup (IF attempts > MaxRetries THEN {"spent"} ELSE {})
    \cup (IF RetryTopic /\ (p = RetryPartition \/ "long" \in f) THEN {"to_topic"} ELSE {})

\* The facts chosen freely for a failure of p ("long" says nothing about a
\* retry-topic record, which goes back to the topic whatever its backoff).
FreeFacts(p) == IF p = RetryPartition THEN FailureFacts \ {"long"} ELSE FailureFacts

\* A decided failure waiting for its DLQ write or hand-off, or for its retry.
NoFate == [facts |-> {}, out |-> "none"]
Fates == [facts : SUBSET FailureFacts, out : DeadLetterOutcomes \cup RetryOutcomes
                                              \cup {"to_topic", "none"}]

-----------------------------------------------------------------------------
(***************************************************************************)
(* The partition gate (core/gate.py TRANSITIONS)                           *)
(***************************************************************************)
GateStates == {"Unassigned", "Claiming", "Active", "Waiting", "Fenced",
               "Reclaiming", "Draining", "Leaving"}
\* GateTable[state][event]: the state after event; a missing entry is illegal.
\* (tests/formal/test_graph_replay.py checks it equals gate.TRANSITIONS.)
\* BEGIN GateTable
GateTable == [
    Unassigned |-> [assigned |-> "Claiming"],
    Claiming   |-> [claimed |-> "Active", fenced |-> "Claiming",
                    rolled_back |-> "Claiming", revoking |-> "Leaving",
                    lost |-> "Unassigned"],
    Active     |-> [assigned |-> "Claiming", retry_wait |-> "Waiting",
                    fenced |-> "Fenced", rolled_back |-> "Reclaiming",
                    revoking |-> "Draining", lost |-> "Unassigned"],
    Waiting    |-> [assigned |-> "Claiming", retry_wait |-> "Waiting",
                    retry_wait_over |-> "Active", fenced |-> "Fenced",
                    rolled_back |-> "Reclaiming", revoking |-> "Draining",
                    lost |-> "Unassigned"],
    Fenced     |-> [assigned |-> "Claiming", fenced |-> "Fenced",
                    rolled_back |-> "Fenced", fence_grace_over |-> "Reclaiming",
                    revoking |-> "Leaving", lost |-> "Unassigned"],
    Reclaiming |-> [claimed |-> "Active", fenced |-> "Reclaiming",
                    rolled_back |-> "Reclaiming", revoking |-> "Leaving",
                    lost |-> "Unassigned"],
    Draining   |-> [fenced |-> "Leaving", rolled_back |-> "Leaving",
                    revoked |-> "Unassigned", lost |-> "Unassigned"],
    Leaving    |-> [fenced |-> "Leaving", rolled_back |-> "Leaving",
                    revoked |-> "Unassigned", lost |-> "Unassigned"]]
\* END GateTable
\* The core holds the partition (HELD); Kafka must hold it paused
\* (ALWAYS_PAUSED); paused exactly while a hold is on (FOLLOWS_HOLDS).
HeldStates == {"Active", "Waiting", "Draining"}
AlwaysPaused == {"Waiting", "Fenced"}
FollowsHolds == {"Active"}

GStep(s, e) == GateTable[s][e]
\* Where Kafka's pause of a partition in state s should be, with the holds hs.
Want(s, hs) == IF s \in AlwaysPaused THEN "paused"
               ELSE IF s \in FollowsHolds THEN (IF hs # {} THEN "paused" ELSE "resumed")
               ELSE "none"
\* After a move to s (told was t0): what the gate believes, and Kafka's flag
\* after the Pause or Resume it asked for (none if it believed it so already).
ToldAfter(s, hs, t0) == IF s = "Unassigned" THEN "unknown"
                        ELSE IF Want(s, hs) = "none" THEN t0 ELSE Want(s, hs)
PausedAfter(s, hs, t0, k0) == IF Want(s, hs) \in {"none", t0} THEN k0
                              ELSE Want(s, hs) = "paused"
\* What the gate believes after `assigned`: nothing (librdkafka keeps a pause
\* across unassign and assign); the mutant believes the partition resumed.
AfterAssigned == IF EXPLICIT_PAUSE THEN "unknown" ELSE "resumed"

\* m's gate moves p to s (told was t0, holds hs); the runtime carries out the
\* Pause or Resume.
MoveGate(m, p, s, t0, hs) ==
    /\ gate' = [gate EXCEPT ![m][p] = s]
    /\ told' = [told EXCEPT ![m][p] = ToldAfter(s, hs, t0)]
    /\ kpaused' = [kpaused EXCEPT ![m][p] = PausedAfter(s, hs, t0, @)]

\* m's holds become hs: every partition follows (Gate.hold / Gate.unhold).
SyncHolds(m, hs) ==
    /\ holds' = [holds EXCEPT ![m] = hs]
    /\ told' = [told EXCEPT ![m] = [p \in Partitions |->
                   IF gate[m][p] = "Unassigned" THEN told[m][p]
                   ELSE ToldAfter(gate[m][p], hs, told[m][p])]]
    /\ kpaused' = [kpaused EXCEPT ![m] = [p \in Partitions |->
                      PausedAfter(gate[m][p], hs, told[m][p], kpaused[m][p])]]
    /\ UNCHANGED <<gate, breaker, trips, races>>

-----------------------------------------------------------------------------
(***************************************************************************)
(* Views                                                                   *)
(***************************************************************************)
\* The view of a partition the member does not hold.
NoView == [held |-> FALSE, epoch |-> 0, token |-> 0, next |-> 0, committed |-> 0,
           requested |-> 0, unsent |-> FALSE,
           st |-> [o \in Offsets |-> "None"], fails |-> [o \in Offsets |-> 0],
           fate |-> [o \in Offsets |-> NoFate], skip |-> {}, pending |-> {}]

\* The token a claim of p hands out (exactly-once); at-least-once claims nothing.
NewToken(p) == IF MODE = EOS THEN fence[p] + 1 ELSE 0

\* PartitionTracker(start = durable[p], finished_above = durableAbove[p]),
\* for the claim numbered e.
Fresh(p, e) == [held |-> TRUE, epoch |-> e, token |-> NewToken(p),
                next |-> durable[p], committed |-> durable[p],
                requested |-> durable[p], unsent |-> FALSE,
                st |-> [o \in Offsets |-> "None"], fails |-> [o \in Offsets |-> 0],
                fate |-> [o \in Offsets |-> NoFate],
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
    \cup (IF FORGET_SKIP THEN {} ELSE v.skip)

\* The offset a commit request hands out (the mutant hands out next).
CommitOffset(v) == IF COMMIT_NEXT THEN v.next ELSE Processed(v)

Holds(m, p) == view[m][p].held
\* PartitionTracker.commit_requested hands out an offset only when it is due.
CommitDue(v) == Processed(v) > v.requested \/ v.unsent
\* The coordinator assigns p to m (every new assignment to m is an Assign step
\* of m, so m's gate belongs to it).
Current(m, p) == owner[p] = m
\* ConsumerCore._current: an event tagged with claim e is about m's current
\* claim of p (otherwise it is late and ignored). The mutant drops the
\* epoch comparison.
InEpoch(m, p, e) == view[m][p].held /\ (view[m][p].epoch = e \/ ~EPOCH_CHECK)
\* The store takes m's commit of p: the sink checks the transaction's fence
\* token (exactly-once); Kafka checks the member's generation (at-least-once).
Accepted(m, p) ==
    IF MODE = EOS THEN ~FENCE \/ view[m][p].token = fence[p] ELSE Current(m, p)

Busy(m) == Cardinality(work[m])
\* The core's in-flight offsets of m (what flow control counts).
InFlight(m) == Cardinality({pq \in Partitions \X Offsets :
                               view[m][pq[1]].held /\ view[m][pq[1]].st[pq[2]] \in Live})
\* Work may be handed out: the breaker is Closed (core/breaker.py allowance).
MayStart(m, p) == gate[m][p] \in {"Active", "Waiting"} /\ breaker[m] = "Closed"

\* Every running handler there can be (a constant set, so that TLC names the
\* actions quantified over it in its coverage and state-graph dumps).
WorkItem == [p : Partitions, o : Offsets, epoch : 1..MaxEpoch]

\* Make the commit of `off` by m for p durable: Kafka commit with metadata, or
\* sink transaction (effects buffered in the view, the watermark, the offsets
\* finished above it).
Store(m, p, off) ==
    LET v == view[m][p] IN
    /\ durable' = [durable EXCEPT ![p] = off]
    /\ durableAbove' = [durableAbove EXCEPT ![p] = {o \in FinishedAbove(v) : o >= off}]
    /\ effects' = IF MODE = EOS
                    THEN [effects EXCEPT ![p] = [o \in Offsets |->
                             IF o \in v.pending THEN Bump(effects[p][o]) ELSE effects[p][o]]]
                    ELSE effects

-----------------------------------------------------------------------------
(***************************************************************************)
(* Group membership: assign, revoking/revoked, lost, crashed, restored,    *)
(* session expiry                                                          *)
(***************************************************************************)
\* assign: the coordinator gives the free partition p to the live member m;
\* its gate asks for a claim (assigned), which the runtime makes at once (a
\* new fence token, the durable position), and then for an explicit Pause or
\* Resume (claimed).
Assign(m, p) ==
    /\ owner[p] = NoMember /\ m \notin down /\ gate[m][p] = "Unassigned"
    /\ epoch[p] < MaxEpoch
    /\ epoch' = [epoch EXCEPT ![p] = @ + 1]
    /\ owner' = [owner EXCEPT ![p] = m]
    /\ fence' = [fence EXCEPT ![p] = NewToken(p)]
    /\ view' = [view EXCEPT ![m][p] = Fresh(p, epoch[p] + 1)]
    /\ MoveGate(m, p, GStep(GStep("Unassigned", "assigned"), "claimed"), AfterAssigned, holds[m])
    /\ UNCHANGED <<holds, breaker, trips, races>>
    /\ UNCHANGED <<down, work, net, durable, durableAbove, effects, dead, crashes,
                   expiries, retryVars>>

\* revoking (cooperative rebalance): the group takes p back; nothing new
\* starts on it (the core drains), running handlers may still finish.
Revoking(m, p) ==
    /\ Current(m, p) /\ m \notin down
    /\ gate[m][p] \in {"Active", "Waiting", "Fenced"}
    /\ epoch[p] < MaxEpoch
    /\ MoveGate(m, p, GStep(gate[m][p], "revoking"), told[m][p], holds[m])
    /\ UNCHANGED <<holds, breaker, trips, races>>
    /\ UNCHANGED <<owner, epoch, fence, down, view, work, net, durable, durableAbove,
                   effects, dead, crashes, expiries, retryVars>>

\* revoked: the final commit (ConsumerCore.revoked returns it; the store takes
\* it unless it is fenced), then p is gone (Drop).
Revoked(m, p) ==
    /\ gate[m][p] \in {"Draining", "Leaving"} /\ m \notin down
    /\ IF Holds(m, p) /\ CommitDue(view[m][p]) /\ Accepted(m, p)
         THEN Store(m, p, CommitOffset(view[m][p]))
         ELSE UNCHANGED <<durable, durableAbove, effects>>
    /\ owner' = [owner EXCEPT ![p] = IF @ = m THEN NoMember ELSE @]
    /\ view' = [view EXCEPT ![m][p] = NoView]
    /\ MoveGate(m, p, GStep(gate[m][p], "revoked"), told[m][p], holds[m])
    /\ UNCHANGED <<holds, breaker, trips, races>>
    /\ UNCHANGED <<epoch, fence, down, work, net, dead, crashes, expiries, retryVars>>

\* lost: m learns that p moved on (it was a zombie); nothing is committed.
RevokedLost(m, p) ==
    /\ gate[m][p] # "Unassigned" /\ ~Current(m, p) /\ m \notin down
    /\ view' = [view EXCEPT ![m][p] = NoView]
    /\ MoveGate(m, p, GStep(gate[m][p], "lost"), told[m][p], holds[m])
    /\ UNCHANGED <<holds, breaker, trips, races>>
    /\ UNCHANGED <<owner, epoch, fence, down, work, net, durable, durableAbove,
                   effects, dead, crashes, expiries, retryVars>>

\* m is paused past its session: the coordinator takes its partitions away,
\* m does not know and keeps working on them (a zombie). Not while m is inside
\* a revoke callback (the drain is bounded well below the session timeout).
SessionExpired(m) ==
    /\ expiries < MaxExpiries
    /\ \E p \in Partitions : owner[p] = m
    /\ \A p \in Partitions : owner[p] = m => epoch[p] < MaxEpoch
    /\ \A p \in Partitions : gate[m][p] \notin {"Draining", "Leaving"}
    /\ owner' = [p \in Partitions |-> IF owner[p] = m THEN NoMember ELSE owner[p]]
    /\ expiries' = expiries + 1
    /\ UNCHANGED <<epoch, fence, down, view, work, net, durable, durableAbove,
                   effects, dead, crashes, gateVars, retryVars>>

\* crashed: every volatile state of m is gone, its handlers, gate, holds and
\* breaker with it (a new process has a new librdkafka: nothing paused); with
\* static membership the coordinator keeps its partitions for it.
Crashed(m) ==
    /\ m \notin down /\ crashes < MaxCrashes
    /\ \A p \in Partitions : owner[p] = m => epoch[p] < MaxEpoch
    /\ down' = down \cup {m}
    /\ view' = [view EXCEPT ![m] = [p \in Partitions |-> NoView]]
    /\ work' = [work EXCEPT ![m] = {}]
    /\ crashes' = crashes + 1
    /\ gate' = [gate EXCEPT ![m] = [p \in Partitions |-> "Unassigned"]]
    /\ told' = [told EXCEPT ![m] = [p \in Partitions |-> "unknown"]]
    /\ kpaused' = [kpaused EXCEPT ![m] = [p \in Partitions |-> FALSE]]
    /\ holds' = [holds EXCEPT ![m] = {}]
    /\ breaker' = [breaker EXCEPT ![m] = "Closed"]
    /\ UNCHANGED <<owner, epoch, fence, net, durable, durableAbove, effects, dead,
                   expiries, trips, races, retryVars>>

\* restored: m restarts; the group gives it its partitions again (assigned),
\* each claimed from the durable position.
Restored(m) ==
    LET mine(p) == owner[p] = m
        s == GStep(GStep("Unassigned", "assigned"), "claimed") IN
    /\ m \in down
    /\ down' = down \ {m}
    /\ epoch' = [p \in Partitions |-> IF mine(p) THEN epoch[p] + 1 ELSE epoch[p]]
    /\ fence' = [p \in Partitions |-> IF mine(p) THEN NewToken(p) ELSE fence[p]]
    /\ view' = [view EXCEPT ![m] = [p \in Partitions |->
                   IF mine(p) THEN Fresh(p, epoch[p] + 1) ELSE NoView]]
    /\ gate' = [gate EXCEPT ![m] = [p \in Partitions |->
                   IF mine(p) THEN s ELSE "Unassigned"]]
    /\ told' = [told EXCEPT ![m] = [p \in Partitions |->
                   IF mine(p) THEN ToldAfter(s, holds[m], AfterAssigned) ELSE "unknown"]]
    /\ kpaused' = [kpaused EXCEPT ![m] = [p \in Partitions |->
                     IF mine(p) THEN PausedAfter(s, holds[m], AfterAssigned, kpaused[m][p])
                     ELSE kpaused[m][p]]]
    /\ UNCHANGED <<owner, work, net, durable, durableAbove, effects, dead, crashes,
                   expiries, holds, breaker, trips, races, retryVars>>

\* A process the group does not know (say a stale duplicate of a static
\* member) claims p in the sink: whoever held the token is fenced.
RacingClaim(p) ==
    /\ MODE = EOS /\ races < MaxRaces
    /\ owner[p] # NoMember /\ epoch[p] < MaxEpoch
    /\ fence' = [fence EXCEPT ![p] = @ + 1]
    /\ races' = races + 1
    /\ UNCHANGED <<owner, epoch, down, view, work, net, durable, durableAbove,
                   effects, dead, crashes, expiries, gate, told, kpaused, holds,
                   breaker, trips, retryVars>>

-----------------------------------------------------------------------------
(***************************************************************************)
(* The gate's own steps: the fence grace, the retry topic's waits, holds   *)
(***************************************************************************)
\* tick, fence grace over: m claims again a partition fenced for its grace
\* (commit 3bdd90a). A member that owns p may always; a zombie only while
\* there is room left for the owner's reclaim after it (a model bound).
GraceOver(m, p) ==
    LET s == GStep(GStep("Fenced", "fence_grace_over"), "claimed") IN
    /\ RECLAIM /\ gate[m][p] = "Fenced" /\ m \notin down
    /\ IF Current(m, p) THEN epoch[p] < MaxEpoch ELSE epoch[p] + 1 < MaxEpoch
    /\ epoch' = [epoch EXCEPT ![p] = @ + 1]
    /\ fence' = [fence EXCEPT ![p] = NewToken(p)]
    /\ view' = [view EXCEPT ![m][p] = Fresh(p, epoch[p] + 1)]
    /\ MoveGate(m, p, s, told[m][p], holds[m])
    /\ UNCHANGED <<holds, breaker, trips, races>>
    /\ UNCHANGED <<owner, down, work, net, durable, durableAbove, effects, dead,
                   crashes, expiries, retryVars>>

\* retry_wait: the next record of the retry topic is not due: Pause, and Seek
\* back to it (the core does not see it).
RetryWait(m, p) ==
    LET v == view[m][p] IN
    /\ p = RetryPartition /\ gate[m][p] = "Active" /\ ~kpaused[m][p]
    /\ v.next < Len(rlog) /\ v.next \notin rdue
    /\ MoveGate(m, p, GStep("Active", "retry_wait"), told[m][p], holds[m])
    /\ UNCHANGED <<holds, breaker, trips, races>>
    /\ UNCHANGED <<owner, epoch, fence, down, view, work, net, durable, durableAbove,
                   effects, dead, crashes, expiries, retryVars>>

\* tick, retry_wait_over: the waiting record is due: Resume (unless a hold is on).
RetryWaitOver(m, p) ==
    /\ gate[m][p] = "Waiting" /\ view[m][p].next \in rdue
    /\ MoveGate(m, p, GStep("Waiting", "retry_wait_over"), told[m][p], holds[m])
    /\ UNCHANGED <<holds, breaker, trips, races>>
    /\ UNCHANGED <<owner, epoch, fence, down, view, work, net, durable, durableAbove,
                   effects, dead, crashes, expiries, retryVars>>

\* Time passes: a record of the retry topic becomes due.
RecordDue(i) ==
    /\ i < Len(rlog) /\ i \notin rdue
    /\ rdue' = rdue \cup {i}
    /\ UNCHANGED <<owner, epoch, fence, down, view, work, net, durable, durableAbove,
                   effects, dead, crashes, expiries, gateVars, rlog>>

\* Flow control: hold while m's in-flight offsets reach the window, lift the
\* hold below it (hold(FLOW) / unhold(FLOW)).
Flow(m) ==
    LET full == InFlight(m) >= FlowWindow IN
    /\ FlowWindow > 0 /\ m \notin down
    /\ full # ("FLOW" \in holds[m])
    /\ SyncHolds(m, IF full THEN holds[m] \cup {"FLOW"} ELSE holds[m] \ {"FLOW"})
    /\ UNCHANGED <<owner, epoch, fence, down, view, work, net, durable, durableAbove,
                   effects, dead, crashes, expiries, retryVars>>

\* The circuit breaker trips (a fault: handlers fail together): hold(BREAKER).
Trip(m) ==
    /\ breaker[m] = "Closed" /\ trips < MaxTrips /\ m \notin down
    /\ breaker' = [breaker EXCEPT ![m] = "Open"]
    /\ trips' = trips + 1
    /\ holds' = [holds EXCEPT ![m] = @ \cup {"BREAKER"}]
    /\ told' = [told EXCEPT ![m] = [p \in Partitions |->
                   IF gate[m][p] = "Unassigned" THEN told[m][p]
                   ELSE ToldAfter(gate[m][p], holds'[m], told[m][p])]]
    /\ kpaused' = [kpaused EXCEPT ![m] = [p \in Partitions |->
                      PausedAfter(gate[m][p], holds'[m], told[m][p], kpaused[m][p])]]
    /\ UNCHANGED <<gate, races>>
    /\ UNCHANGED <<owner, epoch, fence, down, view, work, net, durable, durableAbove,
                   effects, dead, crashes, expiries, retryVars>>

\* The breaker closes (cooled down and a probe succeeded): unhold(BREAKER).
Close(m) ==
    /\ breaker[m] = "Open" /\ m \notin down
    /\ breaker' = [breaker EXCEPT ![m] = "Closed"]
    /\ holds' = [holds EXCEPT ![m] = @ \ {"BREAKER"}]
    /\ told' = [told EXCEPT ![m] = [p \in Partitions |->
                   IF gate[m][p] = "Unassigned" THEN told[m][p]
                   ELSE ToldAfter(gate[m][p], holds'[m], told[m][p])]]
    /\ kpaused' = [kpaused EXCEPT ![m] = [p \in Partitions |->
                      PausedAfter(gate[m][p], holds'[m], told[m][p], kpaused[m][p])]]
    /\ UNCHANGED <<gate, trips, races>>
    /\ UNCHANGED <<owner, epoch, fence, down, view, work, net, durable, durableAbove,
                   effects, dead, crashes, expiries, retryVars>>

-----------------------------------------------------------------------------
(***************************************************************************)
(* Fetching and the message lifecycle                                      *)
(***************************************************************************)
\* fetched: a batch covering [next, e) of an Active partition Kafka does not
\* hold paused; present offsets become Pending, those the sink already holds
\* (skip) arrive finished and leave skip; missing offsets are gaps. Of the
\* retry topic only due records are handed to the core.
Fetched(m, p) ==
    LET v == view[m][p] IN
    /\ gate[m][p] = "Active" /\ ~kpaused[m][p] /\ v.next < EndOf(p)
    /\ \E e \in (v.next + 1)..EndOf(p) :
         /\ p = RetryPartition => \A i \in v.next..(e - 1) : i \in rdue
         /\ view' = [view EXCEPT ![m][p].next = e,
                                 ![m][p].skip = {o \in v.skip : o >= e},
                                 ![m][p].st = [o \in Offsets |->
                                    IF o >= v.next /\ o < e /\ o \in LogOf(p)
                                    THEN IF o \in v.skip THEN "Succeeded" ELSE "Pending"
                                    ELSE v.st[o]]]
    /\ UNCHANGED <<owner, epoch, fence, down, work, net, durable, durableAbove,
                   effects, dead, crashes, expiries, gateVars, retryVars>>

\* started / retry_due: a worker takes a Pending (Retrying) offset; the running
\* handler is tagged with the claim's epoch. Not while draining, nor while the
\* breaker is open.
Run(m, p, o) ==
    /\ Holds(m, p) /\ MayStart(m, p) /\ Busy(m) < Workers
    /\ view' = [view EXCEPT ![m][p].st[o] = "Processing", ![m][p].fate[o] = NoFate]
    /\ work' = [work EXCEPT ![m] = @ \cup {[p |-> p, o |-> o, epoch |-> view[m][p].epoch]}]
    /\ UNCHANGED <<owner, epoch, fence, down, net, durable, durableAbove, effects,
                   dead, crashes, expiries, gateVars, retryVars>>

Started(m, p, o) == view[m][p].st[o] = "Pending" /\ Run(m, p, o)
RetryDue(m, p, o) == view[m][p].st[o] = "Retrying" /\ Run(m, p, o)

\* A running handler w of m reports: the core takes it if it belongs to the
\* current claim (otherwise it is late and changes nothing).
Takes(m, w) == InEpoch(m, w.p, w.epoch) /\ view[m][w.p].st[w.o] = "Processing"

\* succeeded: at-least-once handlers store the effect themselves (late or not);
\* exactly-once ones write it into the transaction of the claim they started
\* under, which is the open one only if that claim is current.
Succeeded(m, w) ==
    LET v == view[m][w.p]
        s == Src(w.p, w.o) IN
    /\ w \in work[m]
    /\ work' = [work EXCEPT ![m] = @ \ {w}]
    /\ view' = IF Takes(m, w)
                 THEN [view EXCEPT ![m][w.p].st[w.o] = "Succeeded", ![m][w.p].unsent = TRUE,
                                   ![m][w.p].pending =
                                      IF MODE = EOS /\ v.epoch = w.epoch THEN @ \cup {w.o} ELSE @]
                 ELSE view
    /\ effects' = IF MODE = ALO THEN [effects EXCEPT ![s.p][s.o] = Bump(@)] ELSE effects
    /\ UNCHANGED <<owner, epoch, fence, down, net, durable, durableAbove, dead,
                   crashes, expiries, gateVars, retryVars>>

\* failed: ConsumerCore.failed counts the failure and failures.decide rules:
\* the facts the runtime sees are chosen freely (FailureFacts), the others
\* read off the state. A retry (in memory, or held by the breaker) leaves the
\* offset Retrying; a dead letter or a hand-off leaves it Failed until the
\* write is done. The decision is kept with the offset (fate).
Failed(m, w) ==
    LET v == view[m][w.p]
        n == v.fails[w.o] + 1
        attempts == n + Prior(w.p, w.o) IN
    /\ w \in work[m]
    /\ work' = [work EXCEPT ![m] = @ \ {w}]
    /\ IF Takes(m, w)
         THEN \E f \in SUBSET FreeFacts(w.p) :
                 LET out == Outcome(FactsOf(f, m, w.p, attempts)) IN
                 view' = [view EXCEPT ![m][w.p].st[w.o] =
                                         IF out \in RetryOutcomes THEN "Retrying" ELSE "Failed",
                                      ![m][w.p].fails[w.o] = n,
                                      ![m][w.p].fate[w.o] = [facts |-> f, out |-> out]]
         ELSE UNCHANGED view
    /\ UNCHANGED <<owner, epoch, fence, down, net, durable, durableAbove, effects,
                   dead, crashes, expiries, gateVars, retryVars>>

\* dead_lettered: the DLQ write asked for by a DeadLetter decision is done.
DeadLettered(m, p, o) ==
    LET s == Src(p, o) IN
    /\ Holds(m, p) /\ view[m][p].st[o] = "Failed"
    /\ view[m][p].fate[o].out \in DeadLetterOutcomes
    /\ view' = [view EXCEPT ![m][p].st[o] = "DeadLettered", ![m][p].unsent = TRUE,
                            ![m][p].fate[o] = NoFate]
    /\ dead' = [dead EXCEPT ![s.p] = @ \cup {s.o}]
    /\ UNCHANGED <<owner, epoch, fence, down, work, net, durable, durableAbove,
                   effects, crashes, expiries, gateVars, retryVars>>

\* handed_off: the retry-topic write asked for by a HandOff decision is done:
\* the record carries the message and its failures; here the offset is done.
HandedOff(m, p, o) ==
    LET v == view[m][p]
        s == Src(p, o) IN
    /\ Holds(m, p) /\ v.st[o] = "Failed" /\ v.fate[o].out = "to_topic"
    /\ Len(rlog) < RetryCap
    /\ rlog' = Append(rlog, [p |-> s.p, o |-> s.o, attempt |-> v.fails[o] + Prior(p, o)])
    /\ view' = [view EXCEPT ![m][p].st[o] = "HandedOff", ![m][p].unsent = TRUE,
                            ![m][p].fate[o] = NoFate]
    /\ UNCHANGED <<owner, epoch, fence, down, work, net, durable, durableAbove,
                   effects, dead, crashes, expiries, gateVars, rdue>>

-----------------------------------------------------------------------------
(***************************************************************************)
(* Commits and their answers                                               *)
(***************************************************************************)
Answer(m, p, off, ok) == [member |-> m, part |-> p, epoch |-> view[m][p].epoch,
                          off |-> off, ok |-> ok]

\* rolled_back: the sink refused m's transaction (its token for p is stale):
\* the core forgets every partition (Drop); p is fenced (paused), the others
\* m still has are claimed again at once (rolled_back, claimed); a draining
\* one just leaves.
RolledBack(m, p) ==
    LET ev(q) == IF q = p THEN "fenced" ELSE "rolled_back"
        mid(q) == IF gate[m][q] = "Unassigned" THEN "Unassigned" ELSE GStep(gate[m][q], ev(q))
        again == {q \in Partitions : mid(q) = "Reclaiming"}
        final(q) == IF q \in again THEN GStep("Reclaiming", "claimed") ELSE mid(q) IN
    /\ \A q \in again : epoch[q] < MaxEpoch
    /\ epoch' = [q \in Partitions |-> IF q \in again THEN epoch[q] + 1 ELSE epoch[q]]
    /\ fence' = [q \in Partitions |-> IF q \in again THEN NewToken(q) ELSE fence[q]]
    /\ view' = [view EXCEPT ![m] = [q \in Partitions |->
                   IF q \in again THEN Fresh(q, epoch[q] + 1) ELSE NoView]]
    /\ gate' = [gate EXCEPT ![m] = [q \in Partitions |-> final(q)]]
    /\ told' = [told EXCEPT ![m] = [q \in Partitions |->
                   IF gate[m][q] = "Unassigned" THEN told[m][q]
                   ELSE ToldAfter(final(q), holds[m], told[m][q])]]
    /\ kpaused' = [kpaused EXCEPT ![m] = [q \in Partitions |->
                     PausedAfter(final(q), holds[m], told[m][q], kpaused[m][q])]]
    /\ UNCHANGED <<holds, breaker, trips, races>>

\* commit_requested: hand out the watermark when it moved or something finished
\* since the last request; the store takes it (if not fenced) and its answer
\* goes into the network. The open transaction's effects go with it. A fenced
\* exactly-once transaction rolls back at once (the sink raises Fenced).
CommitRequested(m, p) ==
    LET v == view[m][p]
        off == CommitOffset(v)
        sent == [view EXCEPT ![m][p].requested = off, ![m][p].unsent = FALSE,
                             ![m][p].pending = {}] IN
    /\ Holds(m, p)
    /\ CommitDue(v)
    /\ \/ /\ Accepted(m, p)
          /\ view' = sent
          /\ Store(m, p, off)
          /\ net' = net \cup {Answer(m, p, off, TRUE)}
          /\ UNCHANGED <<epoch, fence, gateVars>>
       \/ /\ MODE = ALO /\ (~Accepted(m, p) \/ TransientFailures)
          /\ view' = sent
          /\ net' = net \cup {Answer(m, p, off, FALSE)}
          /\ UNCHANGED <<durable, durableAbove, effects, epoch, fence, gateVars>>
       \/ /\ MODE = EOS /\ ~Accepted(m, p)
          /\ RolledBack(m, p)
          /\ UNCHANGED <<net, durable, durableAbove, effects>>
    /\ UNCHANGED <<owner, down, work, dead, crashes, expiries, retryVars>>

\* commit_acked: an answer arrives; late (stale epoch) or duplicated (at or
\* below committed) answers change nothing. keep = TRUE leaves a copy in the
\* network, which is how an answer gets duplicated.
AckDelivered(m, p, msg, keep) ==
    LET v == view[m][p] IN
    /\ msg.member = m /\ msg.part = p /\ msg.ok
    /\ net' = IF keep THEN net ELSE net \ {msg}
    /\ IF InEpoch(m, p, msg.epoch) /\ msg.off > v.committed
         THEN view' = [view EXCEPT ![m][p].committed = msg.off,
                                   ![m][p].requested = Max(@, msg.off)]
         ELSE UNCHANGED view
    /\ UNCHANGED <<owner, epoch, fence, down, work, durable, durableAbove, effects,
                   dead, crashes, expiries, gateVars, retryVars>>

CommitAcked(m, p) == \E msg \in net : AckDelivered(m, p, msg, FALSE)
AckDuplicated(m, p) == \E msg \in net : AckDelivered(m, p, msg, TRUE)

\* commit_failed: the next commit_requested asks again (if not late).
CommitFailed(m, p) ==
    \E msg \in net :
      /\ msg.member = m /\ msg.part = p /\ ~msg.ok
      /\ net' = net \ {msg}
      /\ IF InEpoch(m, p, msg.epoch)
           THEN view' = [view EXCEPT ![m][p].requested = view[m][p].committed,
                                     ![m][p].unsent = TRUE]
           ELSE UNCHANGED view
      /\ UNCHANGED <<owner, epoch, fence, down, work, durable, durableAbove, effects,
                     dead, crashes, expiries, gateVars, retryVars>>

\* The network loses an answer.
AnswerLost ==
    /\ \E msg \in net : net' = net \ {msg}
    /\ UNCHANGED <<owner, epoch, fence, down, view, work, durable, durableAbove,
                   effects, dead, crashes, expiries, gateVars, retryVars>>

-----------------------------------------------------------------------------
(***************************************************************************)
(* The specification                                                       *)
(***************************************************************************)
Init ==
    /\ owner = [p \in Partitions |-> NoMember]
    /\ epoch = [p \in Partitions |-> 0]
    /\ fence = [p \in Partitions |-> 0]
    /\ down = {}
    /\ view = [m \in Members |-> [p \in Partitions |-> NoView]]
    /\ work = [m \in Members |-> {}]
    /\ net = {}
    /\ durable = [p \in Partitions |-> 0]
    /\ durableAbove = [p \in Partitions |-> {}]
    /\ effects = [p \in Partitions |-> [o \in Offsets |-> 0]]
    /\ dead = [p \in Partitions |-> {}]
    /\ crashes = 0
    /\ expiries = 0
    /\ gate = [m \in Members |-> [p \in Partitions |-> "Unassigned"]]
    /\ told = [m \in Members |-> [p \in Partitions |-> "unknown"]]
    /\ kpaused = [m \in Members |-> [p \in Partitions |-> FALSE]]
    /\ holds = [m \in Members |-> {}]
    /\ breaker = [m \in Members |-> "Closed"]
    /\ trips = 0
    /\ races = 0
    /\ rlog = <<>>
    /\ rdue = {}

\* The steps of member m that make progress (the fair ones): the runtime's
\* turn (fetch, run, report, commit, the gate's tick, flow control), the end
\* of a revocation, learning a partition was lost, the breaker closing.
Progress(m) ==
    \/ \E w \in WorkItem : Succeeded(m, w)
    \/ Flow(m) \/ Close(m)
    \/ \E p \in Partitions :
       \/ Fetched(m, p)
       \/ CommitRequested(m, p) \/ CommitAcked(m, p) \/ CommitFailed(m, p)
       \/ Revoked(m, p) \/ RevokedLost(m, p)
       \/ GraceOver(m, p) \/ RetryWait(m, p) \/ RetryWaitOver(m, p)
       \/ \E o \in Offsets :
             \/ Started(m, p, o) \/ RetryDue(m, p, o) \/ DeadLettered(m, p, o)
             \/ HandedOff(m, p, o)

\* Faults and scheduling choices: never required to happen.
Faults(m) ==
    \/ Crashed(m) \/ SessionExpired(m) \/ Trip(m)
    \/ \E w \in WorkItem : Failed(m, w)
    \/ \E p \in Partitions : Revoking(m, p) \/ AckDuplicated(m, p)

Next ==
    \/ \E m \in Members : Progress(m) \/ Faults(m) \/ Restored(m)
    \/ \E m \in Members, p \in Partitions : Assign(m, p)
    \/ \E p \in Partitions : RacingClaim(p)
    \/ \E i \in 0..(RetryCap - 1) : RecordDue(i)
    \/ AnswerLost

\* Fairness: every member's progress, restarts, assignments of free
\* partitions, and time (a retry-topic record becomes due).
Fairness ==
    /\ \A m \in Members : WF_vars(Progress(m)) /\ WF_vars(Restored(m))
    /\ \A p \in Partitions : WF_vars(\E m \in Members : Assign(m, p))
    /\ WF_vars(\E i \in 0..(RetryCap - 1) : RecordDue(i))

Spec == Init /\ [][Next]_vars /\ Fairness

-----------------------------------------------------------------------------
(***************************************************************************)
(* Properties                                                              *)
(***************************************************************************)
ViewType == [held : BOOLEAN, epoch : 0..MaxEpoch, token : 0..(MaxEpoch + MaxRaces),
             next : 0..MaxEnd, committed : 0..MaxEnd, requested : 0..MaxEnd,
             unsent : BOOLEAN,
             st : [Offsets -> Lifecycle \cup {"None"}],
             fails : [Offsets -> 0..(MaxRetries + 1 + MaxTrips)],
             fate : [Offsets -> Fates],
             skip : SUBSET Offsets, pending : SUBSET Offsets]

TypeOK ==
    /\ owner \in [Partitions -> Members \cup {NoMember}]
    /\ epoch \in [Partitions -> 0..MaxEpoch]
    /\ fence \in [Partitions -> 0..(MaxEpoch + MaxRaces)]
    /\ down \subseteq Members
    /\ view \in [Members -> [Partitions -> ViewType]]
    /\ work \in [Members -> SUBSET WorkItem]
    /\ net \subseteq [member : Members, part : Partitions, epoch : 0..MaxEpoch,
                      off : 0..MaxEnd, ok : BOOLEAN]
    /\ durable \in [Partitions -> 0..MaxEnd]
    /\ durableAbove \in [Partitions -> SUBSET Offsets]
    /\ effects \in [Partitions -> [Offsets -> 0..2]]
    /\ dead \in [Partitions -> SUBSET Offsets]
    /\ crashes \in 0..MaxCrashes /\ expiries \in 0..MaxExpiries
    /\ gate \in [Members -> [Partitions -> GateStates \ {"Claiming", "Reclaiming"}]]
    /\ told \in [Members -> [Partitions -> {"unknown", "paused", "resumed"}]]
    /\ kpaused \in [Members -> [Partitions -> BOOLEAN]]
    /\ holds \in [Members -> SUBSET {"FLOW", "BREAKER"}]
    /\ breaker \in [Members -> {"Closed", "Open"}]
    /\ trips \in 0..MaxTrips /\ races \in 0..MaxRaces
    /\ Len(rlog) <= RetryCap
    /\ \A i \in 1..Len(rlog) : rlog[i] \in [p : Data, o : Offsets, attempt : 1..(MaxRetries + 1)]
    /\ rdue \subseteq 0..(Len(rlog) - 1)

\* OffsetOrder: the PartitionTracker invariant, in every member's view
\* (committed <= requested <= processed <= next; live offsets below next;
\* the offsets held by the sink lie at or above next).
OffsetOrder ==
    \A m \in Members, p \in Partitions :
       LET v == view[m][p] IN
       v.held =>
          /\ v.committed <= v.requested
          /\ v.requested <= Processed(v)
          /\ Processed(v) <= v.next
          /\ \A o \in Offsets : v.st[o] \in Live => o < v.next
          /\ \A o \in v.skip : o >= v.next

\* WorkTagged: an offset is Processing in a view exactly when a handler of
\* that view's claim runs it (the epoch tag is what tells the two apart).
WorkTagged ==
    \A m \in Members, p \in Partitions, o \in Offsets :
       LET v == view[m][p] IN
       v.held => ((v.st[o] = "Processing") <=> ([p |-> p, o |-> o, epoch |-> v.epoch] \in work[m]))

\* OneTokenHolder: at most one member holds a partition's current fence
\* token, so at most one member's transactions can be stored (exactly-once).
OneTokenHolder ==
    MODE = EOS =>
       \A p \in Partitions :
          Cardinality({m \in Members : view[m][p].held /\ view[m][p].token = fence[p]}) <= 1

\* CommittedMonotonic: the durable position never moves backwards.
CommittedMonotonic == [][\A p \in Partitions : durable'[p] >= durable[p]]_vars

\* A retry-topic record not done yet (not below the retry partition's
\* durable position nor stored above it) carries message s.
Carried(s) == \E i \in 1..Len(rlog) :
                 /\ rlog[i].p = s.p /\ rlog[i].o = s.o
                 /\ ~(i - 1 < durable[RetryPartition] \/ i - 1 \in durableAbove[RetryPartition])
\* Message s is settled: its effect is stored, it is dead-lettered, or it
\* waits on the retry topic.
Settled(s) == effects[s.p][s.o] >= 1 \/ s.o \in dead[s.p] \/ (RetryTopic /\ Carried(s))

\* NoLoss: every offset the durable position says is done (below it, or stored
\* above it) is settled; gaps need nothing.
NoLoss ==
    \A p \in Partitions : \A o \in LogOf(p) :
       (o < durable[p] \/ o \in durableAbove[p]) => Settled(Src(p, o))

\* NoDuplicateEffect: no offset's effect is stored twice, across crashes,
\* rebalances and zombies (holds in exactly-once mode only).
NoDuplicateEffect == \A p \in Partitions : \A o \in Offsets : effects[p][o] <= 1

\* CoreHoldsHeld: the core holds a partition exactly in the gate's HELD states.
CoreHoldsHeld == \A m \in Members, p \in Partitions : view[m][p].held <=> gate[m][p] \in HeldStates

\* NoStrayPause: Kafka's own pause flag is what the gate's state says: a
\* Waiting or Fenced partition is paused, an Active one exactly while a hold
\* is on (so after an assignment nothing stays paused by accident).
NoStrayPause ==
    \A m \in Members \ down, p \in Partitions :
       /\ gate[m][p] \in AlwaysPaused => kpaused[m][p]
       /\ gate[m][p] \in FollowsHolds => (kpaused[m][p] <=> holds[m] # {})

\* ToldTruth: what the gate believes it told Kafka is Kafka's flag.
ToldTruth ==
    \A m \in Members, p \in Partitions :
       told[m][p] # "unknown" => ((told[m][p] = "paused") <=> kpaused[m][p])

\* AllFinished (liveness): every partition's durable position reaches its log
\* end (for the retry topic, every record written), so every message is
\* finished and its completion is durable.
AllFinished == \A p \in Partitions : <>(durable[p] = EndOf(p))

\* Resumed: p is Active at m and Kafka lets it fetch.
Resumed(m, p) == gate[m][p] = "Active" /\ ~kpaused[m][p]

\* AssignedResumed (liveness): a partition the group assigns to a live member
\* is eventually resumed there (or moves on: revoked, crashed).
AssignedResumed ==
    \A m \in Members, p \in Partitions :
       (owner[p] = m /\ m \notin down) ~> (owner[p] # m \/ m \in down \/ Resumed(m, p))

=============================================================================
