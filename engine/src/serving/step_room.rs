//! How many prompt tokens a step runs beside its decode rows.
//!
//! A forward step cannot be interrupted: a request that comes while one runs
//! waits for it to end before its own prompt can start. With many sequences
//! decoding, a full step (their decode rows, then prompt chunks up to
//! `max_step_tokens`) took several times as long as a short prompt's step
//! alone, and a light tenant's first token waited behind one: 2.9× its time
//! alone beside another tenant's 48 streams (issue 37). So while many
//! sequences run (at least a sixteenth of the budget, decoding or not), a
//! step runs at most a quarter of the budget, its prompt chunks keeping at
//! least a sixteenth so that prompts still advance.
//!
//! Sequences, not only decode rows, make a step busy: a tenant whose many
//! streams start together (their prompts all waiting, few rows decoding)
//! otherwise filled whole-budget prompt steps, four times as long, and a
//! newcomer's wait behind one was the long tail of its time to first token
//! (a timeline of the light tenant's requests: 6 of 236 steps, a quarter of
//! the heavy tenant's time, and the waits of 1 s at p99). On a CPU a step's
//! time grows with its rows, so the busy tenant loses little by the smaller
//! steps (each of its tokens comes sooner); its prompts are computed in more,
//! smaller chunks. With few sequences the whole budget is open, as before, so
//! a long prompt beside one or two streams is not slowed.

/// A step is busy from `max_step_tokens / BUSY_FRACTION` decode rows or
/// sequences; its prompt chunks then keep at least that many tokens.
const BUSY_FRACTION: usize = 16;

/// A busy step runs at most `max_step_tokens / BUSY_STEP_FRACTION` rows
/// (unless its decode rows alone, plus the prompts' least, are more).
const BUSY_STEP_FRACTION: usize = 4;

/// Prompt tokens a step of at most `max_step_tokens` runs beside
/// `decode_rows` decode rows (drafts included), among `sequences` sequences
/// it may run (decoding or with prompt tokens to run).
pub(super) fn prompt_room(max_step_tokens: usize, decode_rows: usize, sequences: usize) -> usize {
    let budget = max_step_tokens.max(1);
    let room = budget.saturating_sub(decode_rows);
    let least = budget / BUSY_FRACTION;
    // A budget under `BUSY_FRACTION` tokens makes short steps already.
    if least == 0 || decode_rows.max(sequences) < least {
        return room;
    }
    let busy = (budget / BUSY_STEP_FRACTION)
        .saturating_sub(decode_rows)
        .max(least);
    room.min(busy)
}

#[cfg(test)]
mod tests {
    use super::prompt_room;

    #[test]
    fn many_decode_rows_shrink_the_step_and_few_leave_the_whole_budget() {
        // Nothing or little decodes: the whole budget, as before.
        assert_eq!(prompt_room(256, 0, 1), 256);
        assert_eq!(prompt_room(256, 15, 15), 241);
        // Busy: at most a quarter of the budget in all, prompts keeping a sixteenth.
        assert_eq!(prompt_room(256, 16, 16), 48);
        assert_eq!(prompt_room(256, 48, 48), 16);
        assert_eq!(prompt_room(256, 200, 200), 16);
        // Decode rows filling the budget leave prompts nothing, as before.
        assert_eq!(prompt_room(256, 256, 256), 0);
        assert_eq!(prompt_room(256, 300, 300), 0);
        // Drafts count as rows: two sequences verifying 8 drafts each are busy.
        assert_eq!(prompt_room(256, 18, 2), 46);
        // Budgets under sixteen tokens stay open to prompts.
        assert_eq!(prompt_room(8, 1, 1), 7);
        assert_eq!(prompt_room(64, 3, 3), 61);
        assert_eq!(prompt_room(64, 4, 4), 12);
        assert_eq!(prompt_room(1, 0, 1), 1);
        assert_eq!(prompt_room(0, 0, 0), 1);
    }

    #[test]
    fn many_sequences_with_prompts_to_run_shrink_the_step_too() {
        // 48 streams' prompts waiting, none decoding: a quarter, not the whole budget.
        assert_eq!(prompt_room(256, 0, 48), 64);
        assert_eq!(prompt_room(256, 0, 16), 64);
        assert_eq!(prompt_room(256, 8, 40), 56);
        // A few long prompts keep the whole budget.
        assert_eq!(prompt_room(256, 0, 3), 256);
        assert_eq!(prompt_room(256, 2, 15), 254);
    }
}
