------------------------------ MODULE Counter ------------------------------
(***************************************************************************)
(* A two-variable counter used by the runner's own tests: x counts up to  *)
(* Limit while y toggles; Small (x < 2) is violated after two steps of x,  *)
(* giving a short counterexample whose printout shows only changed vars.  *)
(***************************************************************************)
EXTENDS Naturals
CONSTANT Limit          \* the highest value of x
VARIABLES x,            \* the counter
          y             \* a flag that changes on every step
vars == <<x, y>>
Init == x = 0 /\ y = FALSE
Next == \/ x < Limit /\ x' = x + 1 /\ y' = ~y
        \/ x = Limit /\ UNCHANGED vars
Spec == Init /\ [][Next]_vars
TypeOK == x \in 0..Limit /\ y \in BOOLEAN
\* NeverUp: an action property expected to fail on the first step.
NeverUp == [][x' <= x]_vars
\* Small: expected to fail once x reaches 2.
Small == x < 2
=============================================================================
