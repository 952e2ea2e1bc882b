//! One checkpoint's queue and batch inside the executor.

use std::collections::VecDeque;
use std::ops::Range;
use std::time::Instant;

use std::sync::Arc;

use switchyard_kernels::kv::KV_UNIT;
use switchyard_kernels::Backend;

use super::checkpoint::CheckpointHandle;
use super::choice::Claim;
use super::fair;
use super::queue::{SequenceEvent, SequenceRequest, SequenceTask, Waiting};
use super::sequence::{Drafter, ModelDrafter, Sequence};
use super::step_room;
use super::tenant_cap::TenantKv;
use crate::kv::admission::{self as kv_admission, NoCache};
use crate::kv::prefix_cache::{Found, PrefixCache};
use crate::kv::{KvBlocks, KvError, SharedBlock};
use crate::model::{Scratch, SequenceChunk};
use crate::speculate::{Ngram, Speculation};
use crate::structured::mask_rows;

/// What [`Group::admit_at`] did with a waiting request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Admission {
    /// Nothing waits.
    Empty,
    /// It runs now, `cached` of its `prompt` tokens read from the prompt
    /// cache of `scope` (its owner's label).
    Admitted {
        cached: usize,
        prompt: usize,
        scope: String,
    },
    /// It left the queue without running (its client left, or its cache
    /// failed; it was told).
    Dropped,
    /// The KV budget has no room for it until a running sequence ends: it
    /// stays first in line.
    Wait,
    /// Its tenant's running sequences hold their part of the KV budget
    /// (`tenant_cap.rs`): it waits for them, and others may pass it.
    TenantFull,
}

/// A sequence's logits rows of a step: `None` when it samples nothing,
/// one row, or one per verified token of a draft.
type StepRows<'l> = Option<Result<Vec<&'l [f32]>, ShortRows>>;

/// The forward pass returned fewer logits rows than the step asked for.
struct ShortRows;

/// The work of one checkpoint: requests waiting, sequences running.
pub(super) struct Group<B: Backend> {
    pub(super) checkpoint: CheckpointHandle<B>,
    pub(super) waiting: VecDeque<Waiting>,
    active: Vec<Sequence<B>>,
    /// When it last ran a step (or when its first request came).
    last_run: Instant,
    /// Whether its sequences speculate, and how.
    speculation: Speculation,
    /// The draft model's activation buffers (made on its first draft).
    draft_scratch: Option<Scratch<B>>,
}

impl<B: Backend> Group<B> {
    pub(super) fn new(
        checkpoint: CheckpointHandle<B>,
        since: Instant,
        speculation: Speculation,
    ) -> Self {
        Group {
            checkpoint,
            waiting: VecDeque::new(),
            active: Vec::new(),
            last_run: since,
            speculation,
            draft_scratch: None,
        }
    }

    /// Sequences decoding and sequences with prompt tokens still to run.
    pub(super) fn load(&self) -> (usize, usize) {
        let decoding = self.active.iter().filter(|s| s.is_decoding()).count();
        (decoding, self.active.len() - decoding)
    }

    /// Drafts each decoding sequence's tokens for the next step when
    /// `allowed` (see `speculate`), within `rows` rows of the step for
    /// this group's decoding sequences; clears last step's drafts otherwise.
    /// Drafts come from prompt lookup and, where the checkpoint has one,
    /// its draft model (`Speculation` says which).
    pub(super) fn draft(
        &mut self,
        allowed: bool,
        rows: usize,
        backend: &B,
        blocks: &Arc<KvBlocks<B>>,
    ) {
        let decoding = self.active.iter().filter(|s| s.is_decoding()).count();
        let room = (rows / decoding.max(1)).saturating_sub(1);
        let draft_model = (self.checkpoint.draft.as_ref())
            .filter(|_| allowed && self.speculation.uses_draft_model());
        let model = draft_model.map(|draft| ModelDrafter {
            backend,
            model: &draft.model,
            blocks,
            scratch: self
                .draft_scratch
                .get_or_insert_with(|| draft.model.new_scratch(backend)),
        });
        let mut drafter = Drafter {
            ngram: self.speculation.looks_up().then(Ngram::default),
            model,
        };
        for sequence in &mut self.active {
            sequence.draft(allowed, &mut drafter, room);
        }
    }

    /// Draft tokens verified and kept since the last call, over its sequences.
    pub(super) fn take_speculation(&mut self) -> (usize, usize) {
        self.active
            .iter_mut()
            .map(Sequence::take_speculation)
            .fold((0, 0), |(d, a), (dd, aa)| (d + dd, a + aa))
    }

    pub(super) fn active_len(&self) -> usize {
        self.active.len()
    }

    /// Token positions its running sequences hold in their KV caches.
    pub(super) fn kv_tokens(&self) -> usize {
        self.active.iter().map(|s| s.processed).sum()
    }

    pub(super) fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.active.is_empty()
    }

    /// The tenants of its running sequences and waiting requests.
    pub(super) fn tenants(&self) -> impl Iterator<Item = &Option<Arc<str>>> {
        (self.active.iter().map(|s| &s.share.tenant))
            .chain(self.waiting.iter().map(|w| &w.request.share.tenant))
    }

    /// Takes `sequence`, admitted and run outside its batch
    /// (`interleave.rs`), into the batch.
    pub(super) fn join(&mut self, sequence: Sequence<B>) {
        self.active.push(sequence);
    }

    /// Adds what its running sequences reserve to their tenants' counts.
    pub(super) fn hold(&self, tenants: &mut TenantKv) {
        for sequence in &self.active {
            tenants.add(&sequence.share.tenant, sequence.cache.reserved_bytes());
        }
    }

    /// Drops sequences whose client went away, freeing their caches now.
    pub(super) fn drop_cancelled(&mut self) {
        let checkpoint = &self.checkpoint;
        self.active.retain(|sequence| {
            let keep = !sequence.is_cancelled();
            if !keep {
                checkpoint.finished();
            }
            keep
        });
    }

    /// Moves waiting request `at` (0: the oldest) into the batch with a KV
    /// cache (see `kv_admission`), starting from the longest prefix of its
    /// prompt that `prefix` holds; or, when a tenant with fewer running
    /// sequences per weight waits too, that tenant's oldest request instead
    /// (`fair.rs`); only requests within their tenant's part of the KV
    /// budget (`tenants`) are admitted. `others_running` says whether any
    /// sequence of any checkpoint holds a cache: when none does and the
    /// budget still has no room, nothing will free it, so the request fails
    /// instead of waiting.
    pub(super) fn admit_at(
        &mut self,
        at: usize,
        backend: &B,
        blocks: &Arc<KvBlocks<B>>,
        others_running: bool,
        prefix: Option<&mut PrefixCache<SharedBlock<B>>>,
        tenants: &TenantKv,
    ) -> Admission {
        let may_run = |w: &Waiting| tenants.fits(&w.request.share, w.kv_bytes);
        let at = fair::next_at(
            &self.waiting,
            at,
            self.active.iter().map(|s| &s.share.tenant),
            may_run,
        );
        let Some(front) = self.waiting.get(at) else {
            return Admission::Empty;
        };
        if front.request.sink.is_closed() {
            self.waiting.remove(at);
            self.checkpoint.admitted();
            self.checkpoint.finished();
            return Admission::Dropped;
        }
        if !may_run(front) {
            let share = &front.request.share;
            if tenants.held(&share.tenant) > 0 {
                return Admission::TenantFull;
            }
            // Nothing of its tenant runs, so nothing will make room: the
            // tenant's part shrank (a policy reload) since it was queued.
            let message = format!(
                "the request's KV cache of about {} bytes is more than its tenant's part \
                 ({}/1000) of the KV budget; lower max_tokens or raise the tenant's kv_share",
                front.kv_bytes, share.kv_permille
            );
            self.fail_at(at, message);
            return Admission::Dropped;
        }
        let Made {
            cache: made,
            shared_blocks,
            cached,
        } = cache_for(backend, blocks, &self.checkpoint, &front.request, prefix);
        let model = &self.checkpoint.model;
        let cache = match made {
            Ok(cache) => cache,
            Err(NoCache::Later { .. }) if others_running => return Admission::Wait,
            Err(NoCache::Later { .. }) => {
                let message = format!(
                    "the KV budget has no room for a cache of {} tokens although no sequence \
                     runs; lower max_tokens",
                    kv_admission::positions(model, front.request.kv_wanted())
                );
                self.fail_at(at, message);
                return Admission::Dropped;
            }
            Err(NoCache::Failed(message)) => {
                self.fail_at(at, message);
                return Admission::Dropped;
            }
        };
        let Some(Waiting { request, .. }) = self.waiting.remove(at) else {
            return Admission::Empty;
        };
        self.checkpoint.admitted();
        let capacity = kv_admission::positions(&self.checkpoint.model, request.kv_wanted());
        let prompt = request.prompt.len();
        let speculation = self.speculation.control();
        let scope = request.cache_scope.label();
        self.active.push(Sequence::new(
            request,
            cache,
            capacity,
            shared_blocks,
            cached,
            speculation,
        ));
        Admission::Admitted {
            cached,
            prompt,
            scope,
        }
    }

    /// Takes waiting request `at` out of the queue, telling it `message`.
    fn fail_at(&mut self, at: usize, message: String) {
        if let Some(Waiting { mut request, .. }) = self.waiting.remove(at) {
            self.checkpoint.admitted();
            request.sink.send(SequenceEvent::Error(message));
            self.checkpoint.finished();
        }
    }

    /// This checkpoint's claim on the next step; `current` says whether
    /// the weight table holds its weights now.
    pub(super) fn claim(&self, max_step_tokens: usize, current: bool) -> Claim {
        let rows = self
            .plan(max_step_tokens)
            .iter()
            .flatten()
            .map(|span| span.len())
            .sum();
        let deadline = self
            .active
            .iter()
            .filter_map(Sequence::deadline)
            .chain(self.waiting.iter().filter_map(|w| w.request.deadline))
            .min();
        Claim {
            waiting_since: self.last_run,
            rows,
            deadline,
            current,
        }
    }

    /// The chunks `spans` (from [`Group::plan`]) asks for, in sequence
    /// order: this checkpoint's share of the step that runs now.
    /// Each sequence's blocks for its span are allocated first.
    pub(super) fn chunks(
        &mut self,
        backend: &B,
        spans: &[Option<Range<usize>>],
    ) -> Result<Vec<SequenceChunk<'_>>, KvError> {
        self.last_run = Instant::now();
        let mut chunks = Vec::with_capacity(self.active.len());
        for (sequence, span) in self.active.iter_mut().zip(spans) {
            let Some(span) = span else { continue };
            chunks.push(sequence.chunk(backend, span.clone())?);
        }
        Ok(chunks)
    }

    /// Rows and sequences that `spans` runs.
    pub(super) fn size(spans: &[Option<Range<usize>>]) -> (usize, usize) {
        let rows = spans.iter().flatten().map(|s| s.len()).sum();
        let sequences = spans.iter().flatten().count();
        (rows, sequences)
    }

    /// The rows `spans` runs when every sequence in it decodes (plain or
    /// verifying); `None` when one runs prompt rows.
    pub(super) fn decode_rows_of(&self, spans: &[Option<Range<usize>>]) -> Option<usize> {
        (self.active.iter().zip(spans))
            .filter_map(|(sequence, span)| Some((sequence, span.as_ref()?)))
            .try_fold(0, |rows, (sequence, span)| {
                sequence.is_decoding().then(|| rows + span.len())
            })
    }

    /// Ends every sequence with `message` (the step's forward failed; which
    /// sequence caused it is unknown, so the whole batch fails rather than
    /// loop on the same error).
    pub(super) fn fail_all(&mut self, message: &str) {
        for sequence in &mut self.active {
            sequence.fail(message.to_string());
            self.checkpoint.finished();
        }
        self.active.clear();
    }

    /// Takes the step's results: each sequence whose span reached its last
    /// token samples from the next row of `logits` (`vocab` floats each);
    /// one whose prompt is now all in its cache then hands its prompt
    /// blocks to `prefix`. Each embedding that ran takes the next row of
    /// `pooled` (`hidden` floats each).
    pub(super) fn finish<'l>(
        &mut self,
        backend: &B,
        spans: Vec<Option<Range<usize>>>,
        logits: &mut impl Iterator<Item = &'l [f32]>,
        pooled: &mut impl Iterator<Item = &'l [f32]>,
        mut prefix: Option<&mut PrefixCache<SharedBlock<B>>>,
    ) {
        let key = self.checkpoint.cache_key();
        if !self.checkpoint.caches_prompts {
            prefix = None;
        }
        // Each sequence whose span reached its last token takes the next
        // row, a verifying one a row per verified token (`Err`: the forward
        // pass came up short). Rows are handed out first so that the
        // grammar masks of the step are computed together, in parallel,
        // before the serial sampling.
        let mut prompt_done = vec![false; self.active.len()];
        let mut pooled_rows: Vec<Option<Option<&'l [f32]>>> = vec![None; self.active.len()];
        let rows: Vec<StepRows<'l>> = self
            .active
            .iter_mut()
            .zip(spans)
            .zip(prompt_done.iter_mut().zip(&mut pooled_rows))
            .map(|((sequence, span), (done, pooled_row))| {
                let span = span?;
                if sequence.is_decoding() && span.len() > 1 {
                    // A verify step: `accept_verified` sets how far it got.
                    return Some(
                        (0..span.len())
                            .map(|_| logits.next().ok_or(ShortRows))
                            .collect(),
                    );
                }
                sequence.processed = span.end;
                if sequence.embeds() {
                    *pooled_row = Some(pooled.next());
                    return None;
                }
                let prompt_len = sequence.prompt().len();
                *done = span.start < prompt_len && span.end >= prompt_len;
                (span.end >= sequence.tokens.len())
                    .then(|| logits.next().map(|row| vec![row]).ok_or(ShortRows))
            })
            .collect();
        mask_rows(
            self.active
                .iter_mut()
                .zip(&rows)
                .filter_map(|(sequence, rows)| {
                    let first = rows.as_ref()?.as_ref().ok()?.first()?;
                    Some((sequence.constraint_mut()?, *first))
                })
                .collect(),
        );
        let keep: Vec<bool> = self
            .active
            .iter_mut()
            .zip(rows.into_iter().zip(pooled_rows))
            .map(|(sequence, (rows, pooled_row))| match (rows, pooled_row) {
                (_, Some(Some(sum))) => sequence.accept_pooled(sum),
                (_, Some(None)) => {
                    sequence.fail("the forward pass returned fewer pooled rows than asked".into());
                    false
                }
                (None, None) => true,
                (Some(Ok(rows)), None) if rows.len() > 1 => sequence.accept_verified(&rows),
                (Some(Ok(rows)), None) => match rows.first() {
                    Some(row) => sequence.accept_logits(row),
                    None => true,
                },
                (Some(Err(ShortRows)), None) => {
                    sequence.fail("the forward pass returned fewer logits rows than asked".into());
                    false
                }
            })
            .collect();
        // After the first tokens went out: copying a prompt's tail takes
        // milliseconds that are not the client's time to first token.
        if let Some(cache) = prefix {
            for (sequence, _) in self.active.iter_mut().zip(prompt_done).filter(|(_, d)| *d) {
                share_prompt(backend, key, sequence, cache);
            }
        }
        let mut keep = keep.into_iter();
        let checkpoint = &self.checkpoint;
        self.active.retain(|_| {
            let goes_on = keep.next().unwrap_or(false);
            if !goes_on {
                checkpoint.finished();
            }
            goes_on
        });
    }

    /// The tokens each sequence runs next step: one for each decoding
    /// sequence, then prompt chunks in arrival order within the step budget,
    /// smaller while many sequences run (`step_room.rs`). While a tenant below
    /// its share has a prompt to run, only that tenant's sequences run
    /// (`fair::step_for`).
    pub(super) fn plan(&self, max_step_tokens: usize) -> Vec<Option<Range<usize>>> {
        let only = fair::step_for(self.active.iter().map(|s| (&s.share, s.is_decoding())));
        let runs = |i: usize| only.as_ref().is_none_or(|mask| mask.get(i) == Some(&true));
        let decoding = (self.active.iter().enumerate())
            .filter(|&(i, s)| runs(i) && s.is_decoding())
            .map(|(_, s)| s.decode_rows());
        let (plain, drafted) = decoding.fold((0, 0), |(n, rows), r| (n + 1, rows + r));
        // Drafts were sized for the whole budget (`draft`); a companion
        // group's smaller share decodes plainly.
        let verify = drafted <= max_step_tokens.max(1);
        let decode_rows = if verify { drafted } else { plain };
        let sequences = (0..self.active.len()).filter(|&i| runs(i)).count();
        let mut budget = step_room::prompt_room(max_step_tokens, decode_rows, sequences);
        self.active
            .iter()
            .enumerate()
            .map(|(i, sequence)| {
                if !runs(i) {
                    return None;
                }
                if sequence.is_decoding() {
                    let rows = if verify { sequence.decode_rows() } else { 1 };
                    return Some(sequence.processed..sequence.processed + rows);
                }
                if budget == 0 {
                    return None;
                }
                let span = sequence.next_span(budget);
                budget -= span.len();
                Some(span)
            })
            .collect()
    }
}

/// A KV cache made for a request ([`cache_for`]), or why none could be.
pub(super) struct Made<B: Backend> {
    pub(super) cache: Result<crate::kv::SequenceKv<B>, NoCache>,
    /// Prompt-cache blocks it reads, and the prompt positions they hold.
    pub(super) shared_blocks: usize,
    pub(super) cached: usize,
}

/// A KV cache for `request` on `checkpoint` (see `kv_admission`), starting
/// from the longest prefix of its prompt that `prefix` holds in the
/// request's scope; cached blocks no sequence reads count as free, so those
/// the budget is short of are evicted first.
pub(super) fn cache_for<B: Backend>(
    backend: &B,
    blocks: &Arc<KvBlocks<B>>,
    checkpoint: &CheckpointHandle<B>,
    request: &SequenceRequest,
    prefix: Option<&mut PrefixCache<SharedBlock<B>>>,
) -> Made<B> {
    let model = &checkpoint.model;
    let mut prefix = prefix.filter(|_| checkpoint.caches_prompts);
    // An embedding pools every prompt row, so it must compute them all
    // (it may still evict cached blocks for room below).
    let found = match prefix.as_deref_mut() {
        Some(cache) if request.task == SequenceTask::Generate => cache.lookup(
            checkpoint.cache_key(),
            &request.cache_scope,
            &request.prompt,
        ),
        _ => Found::none(),
    };
    // A windowed cache starts only where the rings were kept.
    let found = match model.kv_layout(
        blocks.pool().format(),
        kv_admission::positions(model, request.kv_wanted()),
    ) {
        Ok(layout) => crate::kv::window::usable(found, &layout),
        Err(_) => found,
    };
    let cached = found.prefix().positions(blocks.pool().block_positions());
    let mut made =
        kv_admission::make_cache(backend, blocks, model, request.kv_wanted(), found.prefix());
    while let (Err(NoCache::Later { short }), Some(cache)) = (&made, prefix.as_deref_mut()) {
        if cache.evict(*short) == 0 {
            break;
        }
        made =
            kv_admission::make_cache(backend, blocks, model, request.kv_wanted(), found.prefix());
    }
    Made {
        cache: made,
        shared_blocks: found.shared.len(),
        cached,
    }
}

/// Hands `sequence`'s full prompt blocks (past those it took from the
/// cache) and a copy of its tail to the prompt cache, evicting unread
/// cached blocks when the budget has no room for them; a block that cannot
/// be had ends the handing (the sequence runs on either way).
pub(super) fn share_prompt<B: Backend>(
    backend: &B,
    key: crate::kv::CacheKey,
    sequence: &mut Sequence<B>,
    prefix: &mut PrefixCache<SharedBlock<B>>,
) {
    let prompt = sequence.prompt().to_vec();
    let from = sequence.shared_blocks;
    let kv = &mut sequence.cache;
    // The block where the prompt ends (its tail, whole units, or its last
    // full block): a windowed cache keeps its rings there (`kv::window`).
    let end = prompt.len() / KV_UNIT * KV_UNIT;
    let mut share = |range: Range<usize>, cache: &mut PrefixCache<SharedBlock<B>>| {
        let last = range.end == end;
        match kv.share(backend, range.clone(), last) {
            Ok(shared) => Some(shared),
            Err(KvError::Budget { needed, free, .. }) => {
                if cache.evict(needed.saturating_sub(free)) == 0 {
                    return None;
                }
                kv.share(backend, range, last).ok()
            }
            Err(_) => None,
        }
    };
    prefix.insert(key, &sequence.cache_scope, &prompt, from, &mut share);
}
