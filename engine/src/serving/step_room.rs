//! How many prompt tokens a step runs beside its decode rows.
//!
//! A forward step cannot be interrupted: a request that comes while one runs
//! waits for it to end before its own prompt can start. With many sequences
//! decoding, a full step (their decode rows, then prompt chunks up to
//! `max_step_tokens`) took several times as long as a short prompt's step
//! alone, and a light tenant's first token waited behind one: 2.9× its time
//! alone beside another tenant's 48 streams (issue 37). So while many rows
//! decode (at least a sixteenth of the budget), a step runs at most a quarter
//! of the budget, its prompt chunks keeping at least a sixteenth so that
//! prompts still advance. On a CPU a step's time grows with its rows, so the
//! decoders lose little by the smaller steps (and each of their tokens comes
//! sooner); a prompt that arrives among them is computed in more, smaller
//! chunks. With few decode rows the whole budget is open, as before, so a
//! long prompt beside one or two streams is not slowed.

/// A step is busy from `max_step_tokens / BUSY_FRACTION` decode rows; its
/// prompt chunks then keep at least that many tokens.
const BUSY_FRACTION: usize = 16;

/// A busy step runs at most `max_step_tokens / BUSY_STEP_FRACTION` rows
/// (unless its decode rows alone, plus the prompts' least, are more).
const BUSY_STEP_FRACTION: usize = 4;

/// Prompt tokens a step of at most `max_step_tokens` runs beside
/// `decode_rows` decode rows (drafts included).
pub(super) fn prompt_room(max_step_tokens: usize, decode_rows: usize) -> usize {
    let budget = max_step_tokens.max(1);
    let room = budget.saturating_sub(decode_rows);
    let least = budget / BUSY_FRACTION;
    // A budget under `BUSY_FRACTION` tokens makes short steps already.
    if least == 0 || decode_rows < least {
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
        assert_eq!(prompt_room(256, 0), 256);
        assert_eq!(prompt_room(256, 15), 241);
        // Busy: at most a quarter of the budget in all, prompts keeping a sixteenth.
        assert_eq!(prompt_room(256, 16), 48);
        assert_eq!(prompt_room(256, 48), 16);
        assert_eq!(prompt_room(256, 200), 16);
        // Decode rows filling the budget leave prompts nothing, as before.
        assert_eq!(prompt_room(256, 256), 0);
        assert_eq!(prompt_room(256, 300), 0);
        // Budgets under sixteen tokens stay open to prompts.
        assert_eq!(prompt_room(8, 1), 7);
        assert_eq!(prompt_room(64, 3), 61);
        assert_eq!(prompt_room(64, 4), 12);
        assert_eq!(prompt_room(1, 0), 1);
        assert_eq!(prompt_room(0, 0), 1);
    }
}
