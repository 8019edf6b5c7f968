//! A double-ended queue in fixed-size chunks: appending never moves what is already queued.
//!
//! A `VecDeque` that outgrows its buffer copies every element into one twice the size; queue
//! entries hold a whole event (about 170 bytes), so a growing queue spent its time in those
//! copies and in faulting in the new buffers. Here a full chunk is followed by a new one, and a
//! drained front chunk is kept for reuse.

use std::collections::VecDeque;

/// Elements per chunk.
const CHUNK: usize = 128;

/// The deque; elements are taken out of the front by replacing them with their default.
#[derive(Debug)]
pub(super) struct ChunkedDeque<T> {
    chunks: VecDeque<Vec<T>>,
    /// Elements of the first chunk already popped.
    front: usize,
    len: usize,
    /// A drained chunk, kept so that a queue that cycles does not allocate.
    spare: Option<Vec<T>>,
}

impl<T> Default for ChunkedDeque<T> {
    fn default() -> Self {
        Self {
            chunks: VecDeque::new(),
            front: 0,
            len: 0,
            spare: None,
        }
    }
}

impl<T: Default> ChunkedDeque<T> {
    /// Elements held.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds none.
    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn position(&self, index: usize) -> Option<(usize, usize)> {
        (index < self.len).then(|| {
            let at = self.front + index;
            (at / CHUNK, at % CHUNK)
        })
    }

    /// The element `index` places from the front.
    pub(super) fn get(&self, index: usize) -> Option<&T> {
        let (chunk, at) = self.position(index)?;
        self.chunks.get(chunk)?.get(at)
    }

    /// The element `index` places from the front, to change.
    pub(super) fn get_mut(&mut self, index: usize) -> Option<&mut T> {
        let (chunk, at) = self.position(index)?;
        self.chunks.get_mut(chunk)?.get_mut(at)
    }

    /// The front element.
    pub(super) fn front(&self) -> Option<&T> {
        self.get(0)
    }

    /// Appends `value` at the back.
    pub(super) fn push_back(&mut self, value: T) {
        match self.chunks.back_mut() {
            Some(last) if last.len() < CHUNK => last.push(value),
            _ => {
                let mut chunk = self
                    .spare
                    .take()
                    .unwrap_or_else(|| Vec::with_capacity(CHUNK));
                chunk.push(value);
                self.chunks.push_back(chunk);
            }
        }
        self.len += 1;
    }

    /// Takes the front element out.
    pub(super) fn pop_front(&mut self) -> Option<T> {
        if self.len == 0 {
            return None;
        }
        let first = self.chunks.front_mut()?;
        let value = std::mem::take(first.get_mut(self.front)?);
        self.front += 1;
        self.len -= 1;
        if self.front == CHUNK || self.len == 0 {
            if let Some(mut drained) = self.chunks.pop_front() {
                drained.clear();
                self.spare = Some(drained);
            }
            self.front = 0;
        }
        Some(value)
    }

    /// The elements from `index` places behind the front on, front to back; the chunks
    /// before it are skipped whole.
    pub(super) fn iter_from(&self, index: usize) -> impl Iterator<Item = &T> {
        let at = self.front.saturating_add(index.min(self.len));
        self.chunks.range(at / CHUNK..).flatten().skip(at % CHUNK)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against a `VecDeque` under random pushes, pops and writes, across many chunk borders.
    #[test]
    fn behaves_like_a_vecdeque() {
        let mut rng = fastrand::Rng::with_seed(5);
        let mut deque: ChunkedDeque<u64> = ChunkedDeque::default();
        let mut model: VecDeque<u64> = VecDeque::new();
        for step in 0..100_000u64 {
            match rng.u8(..10) {
                0..=4 => {
                    deque.push_back(step);
                    model.push_back(step);
                }
                5 => {
                    if !model.is_empty() {
                        let index = rng.usize(..model.len());
                        *deque.get_mut(index).expect("in range") = step;
                        model[index] = step;
                    }
                }
                _ => assert_eq!(deque.pop_front(), model.pop_front()),
            }
            assert_eq!(deque.len(), model.len());
            assert_eq!(deque.front(), model.front());
            if step % 997 == 0 {
                assert!(deque.iter_from(0).eq(model.iter()));
                let index = rng.usize(..model.len() + 2);
                assert_eq!(deque.get(index), model.get(index));
                assert!(deque.iter_from(index).eq(model.iter().skip(index)));
            }
        }
        while let Some(value) = model.pop_front() {
            assert_eq!(deque.pop_front(), Some(value));
        }
        assert!(deque.is_empty());
        assert_eq!(deque.pop_front(), None);
        assert_eq!(deque.get(0), None);
    }
}
