------------------------------ MODULE Consumer ------------------------------
(***************************************************************************)
(* htmqc: a Kafka consumer group committing per-partition watermarks.      *)
(*                                                                         *)
(* What is modelled                                                        *)
(*   - P partitions whose logs have gaps (compaction, transaction markers);*)
(*   - a group of C members; the coordinator assigns each partition to at  *)
(*     most one member at a time and gives every assignment a fresh epoch; *)
(*   - per member, a bounded pool of workers running handlers; each        *)
(*     running handler is tagged with the epoch of the assignment it was   *)
(*     started under and outlives revocation, so a member reassigned a     *)
(*     partition can hear its old work finish: the core ignores it (late); *)
(*   - the message lifecycle of src/htmqc/core/lifecycle.py, with the      *)
(*     failure decision of ConsumerCore.failed (retry or dead letter);     *)
(*   - per member and partition, the view of PartitionTracker: next,       *)
(*     processed, committed, requested, unsent (something finished since   *)
(*     the last commit request), per-offset states and the offsets the     *)
(*     sink held at assignment (skip);                                     *)
(*   - commits whose answers travel through a network that delays,         *)
(*     duplicates, reorders and loses them;                                *)
(*   - member crash and restart (volatile state and running work lost,     *)
(*     restart from the durable position), session expiry leaving a zombie *)
(*     that still believes it owns its partitions, voluntary revocation;   *)
(*   - a sink, in two MODEs:                                               *)
(*       "at-least-once": the handler stores the effect, the watermark and *)
(*                        the offsets finished above it are committed to   *)
(*                        Kafka afterwards (commit metadata), accepted     *)
(*                        only from the partition's current owner (the     *)
(*                        broker's generation check);                      *)
(*       "exactly-once" : effects, the watermark and the offsets finished  *)
(*                        above it are stored in one sink transaction. The *)
(*                        sink keeps a fence token per partition; every    *)
(*                        claim (assignment, restart) bumps it, the member *)
(*                        keeps the token it got, a transaction carries    *)
(*                        that token and the sink refuses a stale one.     *)
(*                                                                         *)
(* What is verified (see MCConsumer.tla and tla/manifest.json)             *)
(*   TypeOK, OffsetOrder, WorkTagged, OneTokenHolder, CommittedMonotonic,  *)
(*   NoLoss in both modes; NoDuplicateEffect in exactly-once mode (TLC     *)
(*   finds a counterexample in at-least-once mode: duplicates there are    *)
(*   documented, not a bug); AllFinished (liveness) under weak fairness of *)
(*   the non-fault actions. Mutant switches show the properties have       *)
(*   teeth: COMMIT_NEXT (commit `next`) breaks NoLoss; FENCE = FALSE (the  *)
(*   sink takes a stale token) breaks NoDuplicateEffect; EPOCH_CHECK =     *)
(*   FALSE (the core takes an event of an earlier assignment) breaks       *)
(*   NoLoss; FORGET_SKIP (finished_above() as of 2026-11-22) breaks        *)
(*   NoDuplicateEffect.                                                    *)
(*                                                                         *)
(* The state graph of the small models is also replayed edge by edge       *)
(* through the real htmqc.core (model_checks/graph_replay.py); the mapping *)
(* is spec/refinement.md, in code model_checks/refinement.py.              *)
(*                                                                         *)
(* Abstractions (spec/refinement.md)                                       *)
(*   - a commit request reaches the broker/sink atomically with the step   *)
(*     that sends it; only the answer travels through the network;         *)
(*   - revocation is atomic (the core's draining phase is not modelled);   *)
(*   - assignment and the sink claim are one step;                         *)
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
    Workers,           \* handlers one member may run at once
    MaxRetries,        \* retries of one offset before it must be dead-lettered
    MaxEpoch,          \* bound on assignments per partition (model size)
    MaxCrashes,        \* bound on member crashes (model size)
    MaxExpiries,       \* bound on session expiries, i.e. zombies (model size)
    TransientFailures, \* TRUE: an at-least-once commit may fail transiently
    MODE,              \* "at-least-once" or "exactly-once"
    FENCE,             \* TRUE; FALSE is a mutant: the sink takes stale tokens
    EPOCH_CHECK,       \* TRUE; FALSE is a mutant: the core takes events of an
                       \*   earlier assignment as current
    COMMIT_NEXT,       \* FALSE; TRUE is a mutant: commits hand out `next`
    FORGET_SKIP        \* FALSE; TRUE mirrors PartitionTracker.finished_above()
                       \*   as of 2026-11-22, which leaves out skipped offsets
                       \*   not fetched again yet (a duplicate, see manifest)

ALO == "at-least-once"
EOS == "exactly-once"

ASSUME /\ MODE \in {ALO, EOS}
       /\ FENCE \in BOOLEAN /\ EPOCH_CHECK \in BOOLEAN
       /\ COMMIT_NEXT \in BOOLEAN /\ FORGET_SKIP \in BOOLEAN
       /\ TransientFailures \in BOOLEAN
       /\ NoMember \notin Members
       /\ \A p \in Partitions : End[p] \in Nat /\ Log[p] \subseteq 0..(End[p] - 1)
       /\ {Workers, MaxRetries, MaxEpoch, MaxCrashes, MaxExpiries} \subseteq Nat

VARIABLES
    owner,        \* owner[p]: the member the coordinator assigned p to, or NoMember
    epoch,        \* epoch[p]: the epoch of p's current assignment (group side)
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
    expiries      \* session expiries so far

vars == <<owner, epoch, fence, down, view, work, net, durable, durableAbove,
          effects, dead, crashes, expiries>>

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
NoView == [held |-> FALSE, epoch |-> 0, token |-> 0, next |-> 0, committed |-> 0,
           requested |-> 0, unsent |-> FALSE,
           st |-> [o \in Offsets |-> "None"], fails |-> [o \in Offsets |-> 0],
           skip |-> {}, pending |-> {}]

\* The token a claim of p hands out (exactly-once); at-least-once claims nothing.
NewToken(p) == IF MODE = EOS THEN fence[p] + 1 ELSE 0

\* PartitionTracker(start = durable[p], finished_above = durableAbove[p]),
\* for the assignment with epoch e.
Fresh(p, e) == [held |-> TRUE, epoch |-> e, token |-> NewToken(p),
                next |-> durable[p], committed |-> durable[p],
                requested |-> durable[p], unsent |-> FALSE,
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
    \cup (IF FORGET_SKIP THEN {} ELSE v.skip)

\* The offset a commit request hands out (the mutant hands out next).
CommitOffset(v) == IF COMMIT_NEXT THEN v.next ELSE Processed(v)

Holds(m, p) == view[m][p].held
\* PartitionTracker.commit_requested hands out an offset only when it is due.
CommitDue(v) == Processed(v) > v.requested \/ v.unsent
\* The coordinator still gives m the assignment m's view belongs to.
Current(m, p) == owner[p] = m /\ epoch[p] = view[m][p].epoch
\* ConsumerCore._current: an event tagged with epoch e is about m's current
\* assignment of p (otherwise it is late and ignored). The mutant drops the
\* epoch comparison.
InEpoch(m, p, e) == view[m][p].held /\ (view[m][p].epoch = e \/ ~EPOCH_CHECK)
\* The store takes m's commit of p: the sink checks the transaction's fence
\* token (exactly-once); Kafka checks the member's generation (at-least-once).
Accepted(m, p) ==
    IF MODE = EOS THEN ~FENCE \/ view[m][p].token = fence[p] ELSE Current(m, p)

Busy(m) == Cardinality(work[m])

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
(* Group membership: assign, revoked, crashed, restored, session expiry    *)
(***************************************************************************)
\* assign: the coordinator gives the free partition p to the live member m,
\* which claims it in the sink (a new fence token) and starts from the
\* durable position.
Assign(m, p) ==
    /\ owner[p] = NoMember /\ m \notin down /\ ~Holds(m, p)
    /\ epoch[p] < MaxEpoch
    /\ epoch' = [epoch EXCEPT ![p] = @ + 1]
    /\ owner' = [owner EXCEPT ![p] = m]
    /\ fence' = [fence EXCEPT ![p] = NewToken(p)]
    /\ view' = [view EXCEPT ![m][p] = Fresh(p, epoch[p] + 1)]
    /\ UNCHANGED <<down, work, net, durable, durableAbove, effects, dead, crashes, expiries>>

\* revoked (cooperative rebalance): m gives p up; its final commit is made
\* (ConsumerCore.revoked returns it). Running handlers keep running; their
\* completions will be late.
Revoked(m, p) ==
    /\ Holds(m, p) /\ Current(m, p) /\ m \notin down
    /\ epoch[p] < MaxEpoch
    /\ IF CommitDue(view[m][p])
         THEN Store(m, p, CommitOffset(view[m][p]))
         ELSE UNCHANGED <<durable, durableAbove, effects>>
    /\ owner' = [owner EXCEPT ![p] = NoMember]
    /\ view' = [view EXCEPT ![m][p] = NoView]
    /\ UNCHANGED <<epoch, fence, down, work, net, dead, crashes, expiries>>

\* revoked (partitions lost): a zombie learns that p moved on; nothing is committed.
RevokedLost(m, p) ==
    /\ Holds(m, p) /\ ~Current(m, p)
    /\ view' = [view EXCEPT ![m][p] = NoView]
    /\ UNCHANGED <<owner, epoch, fence, down, work, net, durable, durableAbove,
                   effects, dead, crashes, expiries>>

\* m is paused past its session: the coordinator takes its partitions away,
\* m does not know and keeps working on them (a zombie).
SessionExpired(m) ==
    /\ expiries < MaxExpiries
    /\ \E p \in Partitions : owner[p] = m
    /\ \A p \in Partitions : owner[p] = m => epoch[p] < MaxEpoch
    /\ owner' = [p \in Partitions |-> IF owner[p] = m THEN NoMember ELSE owner[p]]
    /\ expiries' = expiries + 1
    /\ UNCHANGED <<epoch, fence, down, view, work, net, durable, durableAbove,
                   effects, dead, crashes>>

\* crashed: every volatile state of m is gone, its handlers with it; with
\* static membership the coordinator keeps its partitions for it.
Crashed(m) ==
    /\ m \notin down /\ crashes < MaxCrashes
    /\ \A p \in Partitions : owner[p] = m => epoch[p] < MaxEpoch
    /\ down' = down \cup {m}
    /\ view' = [view EXCEPT ![m] = [p \in Partitions |-> NoView]]
    /\ work' = [work EXCEPT ![m] = {}]
    /\ crashes' = crashes + 1
    /\ UNCHANGED <<owner, epoch, fence, net, durable, durableAbove, effects, dead, expiries>>

\* restored: m restarts and takes (claims) its partitions again from the
\* durable position.
Restored(m) ==
    /\ m \in down
    /\ down' = down \ {m}
    /\ epoch' = [p \in Partitions |-> IF owner[p] = m THEN epoch[p] + 1 ELSE epoch[p]]
    /\ fence' = [p \in Partitions |-> IF owner[p] = m THEN NewToken(p) ELSE fence[p]]
    /\ view' = [view EXCEPT ![m] = [p \in Partitions |->
                   IF owner[p] = m THEN Fresh(p, epoch[p] + 1) ELSE NoView]]
    /\ UNCHANGED <<owner, work, net, durable, durableAbove, effects, dead, crashes, expiries>>

-----------------------------------------------------------------------------
(***************************************************************************)
(* Fetching and the message lifecycle                                      *)
(***************************************************************************)
\* fetched: a batch covering [next, e); present offsets become Pending, those
\* the sink already holds (skip) arrive finished and leave skip; missing
\* offsets are gaps.
Fetched(m, p) ==
    LET v == view[m][p] IN
    /\ Holds(m, p) /\ v.next < End[p]
    /\ \E e \in (v.next + 1)..End[p] :
         view' = [view EXCEPT ![m][p].next = e,
                              ![m][p].skip = {o \in v.skip : o >= e},
                              ![m][p].st = [o \in Offsets |->
                                 IF o >= v.next /\ o < e /\ o \in Log[p]
                                 THEN IF o \in v.skip THEN "Succeeded" ELSE "Pending"
                                 ELSE v.st[o]]]
    /\ UNCHANGED <<owner, epoch, fence, down, work, net, durable, durableAbove,
                   effects, dead, crashes, expiries>>

\* started / retry_due: a worker takes a Pending (Retrying) offset; the running
\* handler is tagged with the assignment's epoch.
Run(m, p, o) ==
    /\ Holds(m, p) /\ Busy(m) < Workers
    /\ view' = [view EXCEPT ![m][p].st[o] = "Processing"]
    /\ work' = [work EXCEPT ![m] = @ \cup {[p |-> p, o |-> o, epoch |-> view[m][p].epoch]}]
    /\ UNCHANGED <<owner, epoch, fence, down, net, durable, durableAbove, effects,
                   dead, crashes, expiries>>

Started(m, p, o) == view[m][p].st[o] = "Pending" /\ Run(m, p, o)
RetryDue(m, p, o) == view[m][p].st[o] = "Retrying" /\ Run(m, p, o)

\* A running handler w of m reports: the core takes it if it belongs to the
\* current assignment (otherwise it is late and changes nothing).
Takes(m, w) == InEpoch(m, w.p, w.epoch) /\ view[m][w.p].st[w.o] = "Processing"

\* succeeded: at-least-once handlers store the effect themselves (late or not);
\* exactly-once ones write it into the transaction of the assignment they
\* started under, which is the open one only if that assignment is current.
Succeeded(m, w) ==
    LET v == view[m][w.p] IN
    /\ w \in work[m]
    /\ work' = [work EXCEPT ![m] = @ \ {w}]
    /\ view' = IF Takes(m, w)
                 THEN [view EXCEPT ![m][w.p].st[w.o] = "Succeeded", ![m][w.p].unsent = TRUE,
                                   ![m][w.p].pending =
                                      IF MODE = EOS /\ v.epoch = w.epoch THEN @ \cup {w.o} ELSE @]
                 ELSE view
    /\ effects' = IF MODE = ALO THEN [effects EXCEPT ![w.p][w.o] = Bump(@)] ELSE effects
    /\ UNCHANGED <<owner, epoch, fence, down, net, durable, durableAbove, dead,
                   crashes, expiries>>

\* failed: ConsumerCore.failed decides. With retries left, a retryable
\* failure moves on to Retrying (RetryAt); a permanent one, or one with no
\* retries left, stays Failed (DeadLetter: write it to the DLQ).
Failed(m, w) ==
    LET v == view[m][w.p]
        n == v.fails[w.o] + 1 IN
    /\ w \in work[m]
    /\ work' = [work EXCEPT ![m] = @ \ {w}]
    /\ IF Takes(m, w)
         THEN \E to \in IF n <= MaxRetries THEN {"Retrying", "Failed"} ELSE {"Failed"} :
                 view' = [view EXCEPT ![m][w.p].st[w.o] = to, ![m][w.p].fails[w.o] = n]
         ELSE UNCHANGED view
    /\ UNCHANGED <<owner, epoch, fence, down, net, durable, durableAbove, effects,
                   dead, crashes, expiries>>

\* dead_lettered: the DLQ write asked for by a DeadLetter decision is done.
DeadLettered(m, p, o) ==
    /\ Holds(m, p) /\ view[m][p].st[o] = "Failed"
    /\ view' = [view EXCEPT ![m][p].st[o] = "DeadLettered", ![m][p].unsent = TRUE]
    /\ dead' = [dead EXCEPT ![p] = @ \cup {o}]
    /\ UNCHANGED <<owner, epoch, fence, down, work, net, durable, durableAbove,
                   effects, crashes, expiries>>

-----------------------------------------------------------------------------
(***************************************************************************)
(* Commits and their answers                                               *)
(***************************************************************************)
Answer(m, p, off, ok) == [member |-> m, part |-> p, epoch |-> view[m][p].epoch,
                          off |-> off, ok |-> ok]

\* commit_requested: hand out the watermark when it moved or something finished
\* since the last request; the store takes it (if not fenced) and its answer
\* goes into the network. The open transaction's effects go with it.
CommitRequested(m, p) ==
    LET v == view[m][p]
        off == CommitOffset(v) IN
    /\ Holds(m, p)
    /\ CommitDue(v)
    /\ view' = [view EXCEPT ![m][p].requested = off, ![m][p].unsent = FALSE,
                            ![m][p].pending = {}]
    /\ \/ /\ Accepted(m, p)
          /\ Store(m, p, off)
          /\ net' = net \cup {Answer(m, p, off, TRUE)}
       \/ /\ ~Accepted(m, p) \/ (TransientFailures /\ MODE = ALO)
          /\ net' = net \cup {Answer(m, p, off, FALSE)}
          /\ UNCHANGED <<durable, durableAbove, effects>>
    /\ UNCHANGED <<owner, epoch, fence, down, work, dead, crashes, expiries>>

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
                   dead, crashes, expiries>>

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
                     dead, crashes, expiries>>

\* The network loses an answer.
AnswerLost ==
    /\ \E msg \in net : net' = net \ {msg}
    /\ UNCHANGED <<owner, epoch, fence, down, view, work, durable, durableAbove,
                   effects, dead, crashes, expiries>>

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

\* The steps of member m that make progress (the fair ones).
Progress(m) ==
    \/ \E w \in WorkItem : Succeeded(m, w)
    \/ \E p \in Partitions :
       \/ Fetched(m, p)
       \/ CommitRequested(m, p) \/ CommitAcked(m, p) \/ CommitFailed(m, p)
       \/ RevokedLost(m, p)
       \/ \E o \in Offsets :
             \/ Started(m, p, o) \/ RetryDue(m, p, o) \/ DeadLettered(m, p, o)

\* Faults and scheduling choices: never required to happen.
Faults(m) ==
    \/ Crashed(m) \/ SessionExpired(m)
    \/ \E w \in WorkItem : Failed(m, w)
    \/ \E p \in Partitions : Revoked(m, p) \/ AckDuplicated(m, p)

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
ViewType == [held : BOOLEAN, epoch : 0..MaxEpoch, token : 0..MaxEpoch,
             next : 0..MaxEnd, committed : 0..MaxEnd, requested : 0..MaxEnd,
             unsent : BOOLEAN,
             st : [Offsets -> Lifecycle \cup {"None"}],
             fails : [Offsets -> 0..(MaxRetries + 1)],
             skip : SUBSET Offsets, pending : SUBSET Offsets]

TypeOK ==
    /\ owner \in [Partitions -> Members \cup {NoMember}]
    /\ epoch \in [Partitions -> 0..MaxEpoch]
    /\ fence \in [Partitions -> 0..MaxEpoch]
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
\* that view's assignment runs it (the epoch tag is what tells the two apart).
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
