--------------------------- MODULE TraceConsumer ---------------------------
(***************************************************************************)
(* Trace validation: is a trace written by `htmqc run --trace` a behaviour *)
(* of Consumer.tla?                                                        *)
(*                                                                         *)
(* What is verified                                                        *)
(*   TLC explores the behaviours of Consumer.tla whose every step is the   *)
(*   spec action named by the next trace line, with that line's partition  *)
(*   and offset, and whose member view then shows the recorded next,       *)
(*   processed and committed (checked at the last line of each batch: the  *)
(*   runtime writes one line per offset with the state after the batch).   *)
(*   The invariant TraceUnmatched (i < Len(Trace)) is *expected to fail*:  *)
(*   TLC reporting it violated means a behaviour matching every line       *)
(*   exists (the trace is accepted). If TLC ends without that violation,   *)
(*   no behaviour of the spec produces the trace (rejected); each new      *)
(*   deepest line matched is printed as <<"deepest", N>> (register 1).     *)
(*   The spec's own invariants (TypeOK, OffsetOrder,                       *)
(*   NoLoss and, exactly-once, NoDuplicateEffect) are checked on the way.  *)
(*                                                                         *)
(* The trace comes as constants of a module that model_checks/             *)
(* trace_validation.py generates for each run (TLC 2.15 has no Json or     *)
(* IOUtils module): Trace, one record a line                               *)
(*   [ev, p, off (-1 for none), offs (fetched: the batch's offsets),       *)
(*    check (last line of its batch), held (the line carries a state),     *)
(*    next, processed, committed]                                          *)
(* and the model's constants (Log, End, ...) derived from it.              *)
(*                                                                         *)
(* Steps the trace does not record (spec/refinement.md)                    *)
(*   - commit_requested: the runtime does not trace it; a hidden           *)
(*     CommitRequested step is allowed when the watermark equals an offset *)
(*     the trace later acks, fails, finally commits or assigns from        *)
(*     (CommitPoints), which keeps the search small;                       *)
(*   - session expiry: a member cannot see it; a hidden SessionExpired     *)
(*     step is allowed just before a `revoked` line (RevokedLost);         *)
(*   - `revoking` (draining) is not modelled: a stuttering step.           *)
(* The trace belongs to one member, M. Its first assignment of p starts    *)
(* at Start[p] (StartAbove[p] above it): earlier members finished what is  *)
(* below, so TraceInit is Init with those positions durable and done.      *)
(***************************************************************************)
EXTENDS Consumer, Integers, Sequences, TLC

CONSTANTS
    Trace,         \* the trace lines (records, see above)
    M,             \* the member that wrote the trace (model value)
    Start,         \* Start[p]: durable position of p when the trace begins
    StartAbove,    \* StartAbove[p]: offsets above Start[p] already stored
    CommitPoints   \* CommitPoints[p]: offsets a hidden commit request may hand out

VARIABLE i         \* trace lines matched so far

traceVars == <<vars, i>>

TraceInit ==
    /\ owner = [p \in Partitions |-> NoMember]
    /\ epoch = [p \in Partitions |-> 0]
    /\ down = {}
    /\ view = [m \in Members |-> [p \in Partitions |-> NoView]]
    /\ net = {}
    /\ durable = Start
    /\ durableAbove = StartAbove
    /\ effects = [p \in Partitions |-> [o \in Offsets |->
                     IF o < Start[p] \/ o \in StartAbove[p] THEN 1 ELSE 0]]
    /\ dead = [p \in Partitions |-> {}]
    /\ crashes = 0
    /\ expiries = 0
    /\ i = 0
    /\ TLCSet(1, 0)

-----------------------------------------------------------------------------
(***************************************************************************)
(* One trace line, one spec step                                           *)
(***************************************************************************)
V(p) == view[M][p]

\* The recorded state after the line (only at the end of a batch).
StateMatches(l) ==
    l.check =>
        IF l.held
        THEN /\ view'[M][l.p].held
             /\ view'[M][l.p].next = l.next
             /\ Processed(view'[M][l.p]) = l.processed
             /\ view'[M][l.p].committed = l.committed
        ELSE ~view'[M][l.p].held

\* A step that changes nothing the spec sees.
Stutter == UNCHANGED vars

AssignStep(l) ==
    \/ /\ M \notin down
       /\ durable[l.p] = l.off
       /\ Assign(M, l.p)
    \/ /\ M \in down
       /\ owner[l.p] = M /\ durable[l.p] = l.off
       /\ Restored(M)
    \* the other partitions of one Restored step (already fresh in the view)
    \/ /\ M \notin down /\ crashes > 0
       /\ i > 0 /\ Trace[i].ev = "assign"
       /\ V(l.p).held /\ V(l.p).next = l.off /\ V(l.p).committed = l.off
       /\ \A o \in Offsets : V(l.p).st[o] = "None"
       /\ Stutter

FetchedStep(l) ==
    /\ l.offs = {o \in V(l.p).next..(l.next - 1) : o \in Log[l.p]}
    /\ Fetched(M, l.p)
    /\ view'[M][l.p].next = l.next

AckStep(l) ==
    \E msg \in net :
       /\ msg.off = l.off
       /\ AckDelivered(M, l.p, msg, FALSE)

CommitFailedStep(l) ==
    /\ \E msg \in net : /\ msg.member = M /\ msg.part = l.p /\ ~msg.ok
                        /\ msg.off = l.off /\ net' = net \ {msg}
    /\ CommitFailed(M, l.p)

CrashedStep(l) ==
    IF M \in down THEN Stutter ELSE Crashed(M)

Step(l) ==
    CASE l.ev = "assign"          -> AssignStep(l)
      [] l.ev = "fetched"         -> FetchedStep(l)
      [] l.ev = "started"         -> Started(M, l.p, l.off)
      [] l.ev = "succeeded"       -> Succeeded(M, l.p, l.off)
      [] l.ev = "failed"          -> Failed(M, l.p, l.off)
      [] l.ev = "retry_scheduled" -> RetryScheduled(M, l.p, l.off)
      [] l.ev = "retry_due"       -> RetryDue(M, l.p, l.off)
      [] l.ev = "dead_lettered"   -> DeadLettered(M, l.p, l.off)
      [] l.ev = "commit_acked"    -> AckStep(l)
      [] l.ev = "commit_failed"   -> CommitFailedStep(l)
      [] l.ev = "revoking"        -> V(l.p).held /\ Stutter
      [] l.ev = "revoked"         -> Revoked(M, l.p) \/ RevokedLost(M, l.p)
      [] l.ev = "crashed"         -> CrashedStep(l)
      [] OTHER                    -> FALSE

TraceStep ==
    /\ i < Len(Trace)
    /\ Step(Trace[i + 1])
    /\ StateMatches(Trace[i + 1])
    /\ i' = i + 1
    /\ IF i' > TLCGet(1) THEN TLCSet(1, i') /\ PrintT(<<"deepest", i'>>) ELSE TRUE

\* Steps the trace cannot show (see the header).
HiddenStep ==
    /\ i < Len(Trace)
    /\ \/ \E p \in Partitions :
             /\ Holds(M, p)
             /\ Processed(V(p)) \in CommitPoints[p]
             /\ CommitRequested(M, p)
       \/ /\ Trace[i + 1].ev = "revoked"
          /\ SessionExpired(M)
    /\ UNCHANGED i

TraceNext == TraceStep \/ HiddenStep

TraceSpec == TraceInit /\ [][TraceNext]_traceVars

\* Expected to be violated: TLC then shows a behaviour matching the whole trace.
TraceUnmatched == i < Len(Trace)
=============================================================================
