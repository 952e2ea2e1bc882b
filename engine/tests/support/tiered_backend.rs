//! A backend with a host tier, for the engine's side of residency tiers:
//! any compiled backend behind a wrapper whose matrices can be demoted to
//! "host memory" and prefetched back, the copy landing after a few looks
//! at its tier (a copy stream that runs beside the steps). A step that
//! reads a matrix not on the device fails, as the CUDA backend refuses it,
//! and every prefetch, demotion and step is recorded. The bookkeeping the
//! CUDA backend really runs is tested over the host stand-in in the
//! kernels crate (`cuda/weight_tiers_tests.rs`); this checks what the
//! registry and the executor ask of it. Include it with
//! `#[path = "support/tiered_backend.rs"] mod tiered_backend;`.
#![allow(dead_code)] // each test crate uses its own part

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use switchyard_kernels::kv::{BlockId, KvBlockShape};
use switchyard_kernels::{
    AttentionRows, AttentionShape, Backend, KernelError, KvFormat, LoraRows, MatmulInput,
    MatmulProduct, RopeStyle, WeightTier, WeightView,
};

/// Looks at a matrix's tier before its copy up lands.
pub const COPY_LOOKS: u32 = 3;

/// What the wrapper saw, each naming a matrix by its id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    Demote(u64),
    Prefetch(u64),
    /// A step's embedding (its first call) through this table.
    Step(u64),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    Device,
    Host,
    /// Copying up: lands after this many more looks.
    Uploading(u32),
}

pub struct TieredMatrix<B: Backend> {
    inner: B::Matrix,
    pub id: u64,
    bytes: u64,
    place: Mutex<Place>,
    host_bytes: Arc<AtomicU64>,
}

impl<B: Backend> Drop for TieredMatrix<B> {
    fn drop(&mut self) {
        if self
            .place
            .get_mut()
            .map(|p| *p != Place::Device)
            .unwrap_or(false)
        {
            self.host_bytes.fetch_sub(self.bytes, Ordering::AcqRel);
        }
    }
}

pub struct Tiered<B: Backend> {
    inner: Arc<B>,
    pub events: Mutex<Vec<Event>>,
    next_id: AtomicU64,
    host_budget: u64,
    host_bytes: Arc<AtomicU64>,
}

impl<B: Backend> Tiered<B> {
    pub fn new(inner: Arc<B>, host_budget: u64) -> Self {
        Tiered {
            inner,
            events: Mutex::default(),
            next_id: AtomicU64::new(1),
            host_budget,
            host_bytes: Arc::default(),
        }
    }

    pub fn take_events(&self) -> Vec<Event> {
        std::mem::take(&mut *self.events.lock().unwrap())
    }

    fn record(&self, event: Event) {
        self.events.lock().unwrap().push(event);
    }

    /// `w` for a kernel: refused unless on the device.
    fn read<'a>(&self, w: &'a TieredMatrix<B>) -> Result<&'a B::Matrix, KernelError> {
        match *w.place.lock().unwrap() {
            Place::Device => Ok(&w.inner),
            other => Err(KernelError::Device(format!(
                "a step read matrix {} while it was {other:?}",
                w.id
            ))),
        }
    }
}

fn input<B: Backend>(m: MatmulInput<'_, Tiered<B>>) -> MatmulInput<'_, B> {
    match m {
        MatmulInput::Rows(x) => MatmulInput::Rows(x),
        MatmulInput::RmsNorm {
            x,
            weight,
            eps,
            out,
        } => MatmulInput::RmsNorm {
            x,
            weight,
            eps,
            out,
        },
        MatmulInput::SiluMul { gate, up } => MatmulInput::SiluMul { gate, up },
        MatmulInput::GeluMul { gate, up } => MatmulInput::GeluMul { gate, up },
    }
}

impl<B: Backend> Backend for Tiered<B> {
    type Matrix = TieredMatrix<B>;
    type Vector = B::Vector;
    type Activations = B::Activations;
    type KvStore = B::KvStore;

    const DEVICE_MEMORY: bool = true;

    fn name(&self) -> String {
        format!("tiered-{}", self.inner.name())
    }

    fn weight_tier(&self, weights: &[&TieredMatrix<B>]) -> WeightTier {
        let mut tier = WeightTier::Resident;
        for w in weights {
            let mut place = w.place.lock().unwrap();
            match *place {
                Place::Device => {}
                Place::Host => tier = WeightTier::Host,
                Place::Uploading(0) => {
                    *place = Place::Device;
                    self.host_bytes.fetch_sub(w.bytes, Ordering::AcqRel);
                }
                Place::Uploading(n) => {
                    *place = Place::Uploading(n - 1);
                    if tier == WeightTier::Resident {
                        tier = WeightTier::Uploading;
                    }
                }
            }
        }
        tier
    }

    fn demote(&self, weights: &[&TieredMatrix<B>]) -> Result<bool, KernelError> {
        let moving: u64 = weights
            .iter()
            .filter(|w| *w.place.lock().unwrap() == Place::Device)
            .map(|w| w.bytes)
            .sum();
        if self.host_bytes.load(Ordering::Acquire) + moving > self.host_budget {
            return Ok(false);
        }
        for w in weights {
            let mut place = w.place.lock().unwrap();
            if *place == Place::Device {
                *place = Place::Host;
            }
        }
        self.host_bytes.fetch_add(moving, Ordering::AcqRel);
        if let Some(first) = weights.first() {
            self.record(Event::Demote(first.id));
        }
        Ok(true)
    }

    fn prefetch(&self, weights: &[&TieredMatrix<B>]) -> Result<WeightTier, KernelError> {
        for w in weights {
            let mut place = w.place.lock().unwrap();
            if *place == Place::Host {
                *place = Place::Uploading(COPY_LOOKS);
            }
        }
        if let Some(first) = weights.first() {
            self.record(Event::Prefetch(first.id));
        }
        Ok(WeightTier::Uploading)
    }

    fn host_tier_bytes(&self) -> u64 {
        self.host_bytes.load(Ordering::Acquire)
    }

    fn matrix(&self, weight: WeightView) -> Result<Self::Matrix, KernelError> {
        let bytes = weight.data.len() as u64;
        Ok(TieredMatrix {
            inner: self.inner.matrix(weight)?,
            id: self.next_id.fetch_add(1, Ordering::AcqRel),
            bytes,
            place: Mutex::new(Place::Device),
            host_bytes: Arc::clone(&self.host_bytes),
        })
    }
    fn vector(&self, values: &[f32]) -> Result<Self::Vector, KernelError> {
        self.inner.vector(values)
    }
    fn activations(&self, rows: usize, cols: usize) -> Self::Activations {
        self.inner.activations(rows, cols)
    }
    fn host_rows<'a>(&self, x: &'a Self::Activations, staging: &'a mut Vec<f32>) -> &'a [f32] {
        self.inner.host_rows(x, staging)
    }
    fn resize(&self, x: &mut Self::Activations, rows: usize, cols: usize) {
        self.inner.resize(x, rows, cols)
    }
    fn kv_store(&self, format: KvFormat, budget: usize) -> Result<Self::KvStore, KernelError> {
        self.inner.kv_store(format, budget)
    }
    fn kv_alloc(&self, s: &mut Self::KvStore, shape: KvBlockShape) -> Result<BlockId, KernelError> {
        self.inner.kv_alloc(s, shape)
    }
    fn kv_free(store: &mut Self::KvStore, id: BlockId) {
        B::kv_free(store, id)
    }
    fn kv_copy(
        &self,
        s: &mut Self::KvStore,
        from: BlockId,
        to: BlockId,
        positions: usize,
    ) -> Result<(), KernelError> {
        self.inner.kv_copy(s, from, to, positions)
    }
    fn begin_step(&self, key: Option<switchyard_kernels::StepKey>) {
        self.inner.begin_step(key)
    }
    fn end_step(&self) -> Result<(), KernelError> {
        self.inner.end_step()
    }
    fn abort_step(&self) {
        self.inner.abort_step()
    }
    fn embed(
        &self,
        t: &Self::Matrix,
        tokens: &[u32],
        out: &mut Self::Activations,
    ) -> Result<(), KernelError> {
        self.record(Event::Step(t.id));
        self.inner.embed(self.read(t)?, tokens, out)
    }
    fn rms_norm(
        &self,
        x: &Self::Activations,
        w: &Self::Vector,
        eps: f32,
        out: &mut Self::Activations,
    ) -> Result<(), KernelError> {
        self.inner.rms_norm(x, w, eps, out)
    }
    fn matmul(
        &self,
        x: &Self::Activations,
        w: &Self::Matrix,
        bias: Option<&Self::Vector>,
        out: &mut Self::Activations,
    ) -> Result<(), KernelError> {
        self.inner.matmul(x, self.read(w)?, bias, out)
    }
    fn matmul_many(
        &self,
        x: MatmulInput<'_, Self>,
        products: &mut [MatmulProduct<'_, Self>],
    ) -> Result<(), KernelError> {
        let mut own = Vec::with_capacity(products.len());
        for p in products.iter_mut() {
            own.push(MatmulProduct {
                w: self.read(p.w)?,
                bias: p.bias,
                out: &mut *p.out,
                accumulate: p.accumulate,
            });
        }
        self.inner.matmul_many(input(x), &mut own)
    }
    fn rope(
        &self,
        x: &mut Self::Activations,
        head_dim: usize,
        positions: &[u32],
        inv_freq: &[f32],
        style: RopeStyle,
    ) -> Result<(), KernelError> {
        self.inner.rope(x, head_dim, positions, inv_freq, style)
    }
    fn attention(
        &self,
        layer: usize,
        shape: AttentionShape,
        q: &Self::Activations,
        k: &Self::Activations,
        v: &Self::Activations,
        store: &mut Self::KvStore,
        seqs: &[AttentionRows<'_>],
        out: &mut Self::Activations,
    ) -> Result<(), KernelError> {
        self.inner
            .attention(layer, shape, q, k, v, store, seqs, out)
    }
    fn silu_mul(
        &self,
        g: &mut Self::Activations,
        u: &Self::Activations,
    ) -> Result<(), KernelError> {
        self.inner.silu_mul(g, u)
    }
    fn gelu_mul(
        &self,
        g: &mut Self::Activations,
        u: &Self::Activations,
    ) -> Result<(), KernelError> {
        self.inner.gelu_mul(g, u)
    }
    fn scale(&self, x: &mut Self::Activations, factor: f32) -> Result<(), KernelError> {
        self.inner.scale(x, factor)
    }
    fn softcap(&self, x: &mut Self::Activations, cap: f32) -> Result<(), KernelError> {
        self.inner.softcap(x, cap)
    }
    fn rms_norm_heads(
        &self,
        x: &mut Self::Activations,
        w: &Self::Vector,
        eps: f32,
    ) -> Result<(), KernelError> {
        self.inner.rms_norm_heads(x, w, eps)
    }
    fn add(&self, x: &mut Self::Activations, y: &Self::Activations) -> Result<(), KernelError> {
        self.inner.add(x, y)
    }
    fn lora(
        &self,
        x: &Self::Activations,
        runs: &[LoraRows<'_, Self>],
        out: &mut Self::Activations,
    ) -> Result<(), KernelError> {
        let mut own: Vec<LoraRows<'_, B>> = Vec::with_capacity(runs.len());
        for r in runs {
            own.push(LoraRows {
                rows: r.rows.clone(),
                a: self.read(r.a)?,
                b_t: self.read(r.b_t)?,
                scale: r.scale,
            });
        }
        self.inner.lora(x, &own, out)
    }
    fn copy_rows(
        &self,
        src: &Self::Activations,
        rows: Range<usize>,
        dst: &mut Self::Activations,
        dst_row: usize,
    ) -> Result<(), KernelError> {
        self.inner.copy_rows(src, rows, dst, dst_row)
    }
}
