package lifecycle

// Images: which image a create runs on, which sandboxes and pools use an
// image, and removing one only while nothing does.

import (
	"cmp"
	"errors"
	"fmt"
	"slices"

	"github.com/sandbox-sidecar/sandbox-sidecar/backend"
)

// Images is the image store as the manager sees it (sandbox/image, adapted
// by the daemon's wiring). Get of an unknown name returns an error
// wrapping backend.ErrImageNotFound.
type Images interface {
	Get(name string) (backend.Image, error)
	List() []backend.Image
}

func cmpOr(s, def string) string { return cmp.Or(s, def) }

// defaultImage is the name of a create's image when it names none.
func (m *Manager) defaultImage() string { return cmp.Or(m.cfg.DefaultImage, backend.HostImage) }

// ImageList returns the images a create may name: the built-in host
// image first, then the store's by name.
func (m *Manager) ImageList() []backend.Image {
	out := []backend.Image{{Name: backend.HostImage}}
	if m.cfg.Images != nil {
		imgs := m.cfg.Images.List()
		slices.SortFunc(imgs, func(a, b backend.Image) int { return cmp.Compare(a.Name, b.Name) })
		out = append(out, imgs...)
	}
	return out
}

// ImageNames returns the names of ImageList.
func (m *Manager) ImageNames() []string {
	var names []string
	for _, im := range m.ImageList() {
		names = append(names, im.Name)
	}
	return names
}

// DefaultImage returns the image of a create that names none.
func (m *Manager) DefaultImage() string { return m.defaultImage() }

// ResolveImage returns the image name stands for ("": the default).
func (m *Manager) ResolveImage(name string) (backend.Image, error) {
	name = cmp.Or(name, m.defaultImage())
	if name == backend.HostImage {
		return backend.Image{Name: backend.HostImage}, nil
	}
	if m.cfg.Images != nil {
		im, err := m.cfg.Images.Get(name)
		if err == nil {
			return im, nil
		}
		if !errors.Is(err, backend.ErrImageNotFound) {
			return backend.Image{}, err
		}
	}
	return backend.Image{}, &backend.ImageNotFoundError{Name: name, Known: m.ImageNames()}
}

// poolSizes are the warm pool's target per image name; only sizes > 0.
func (m *Manager) poolSizes() map[string]int {
	sizes := map[string]int{}
	if m.cfg.PoolSize > 0 {
		sizes[m.defaultImage()] = m.cfg.PoolSize
	}
	for name, n := range m.cfg.ImagePools {
		if n > 0 {
			sizes[cmp.Or(name, backend.HostImage)] = n
		} else {
			delete(sizes, name)
		}
	}
	return sizes
}

// poolSize is the warm pool's target for image name.
func (m *Manager) poolSize(name string) int { return m.poolSizes()[name] }

// RemoveImage calls remove, which deletes image name from the store, only
// while no sandbox (in any state, the pool's included) runs on it and no
// pool is configured for it; meanwhile no create may take it. The
// built-in host image cannot be removed.
func (m *Manager) RemoveImage(name string, remove func() error) error {
	if name == backend.HostImage || name == "" {
		return fmt.Errorf("%w: %q is the built-in image (the host's /usr) and cannot be removed", ErrInvalid, backend.HostImage)
	}
	m.mu.Lock()
	inUse := &backend.ImageInUseError{Name: name, Pool: m.poolSize(name) > 0}
	for _, r := range m.boxes {
		if r.Image == name {
			if r.Pooled {
				if !inUse.Pool {
					inUse.Leftover++
				}
			} else {
				inUse.Sandboxes = append(inUse.Sandboxes, r.ID)
			}
		}
	}
	if m.removingImages[name] {
		m.mu.Unlock()
		return fmt.Errorf("%w: image %s is being removed by another request", backend.ErrImageInUse, backend.ShortName(name))
	}
	if len(inUse.Sandboxes) > 0 || inUse.Pool || inUse.Leftover > 0 {
		m.mu.Unlock()
		slices.Sort(inUse.Sandboxes)
		return inUse
	}
	m.removingImages[name] = true
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		delete(m.removingImages, name)
		m.mu.Unlock()
	}()
	err := remove()
	// Even after a failed remove: the store may have gone part way, and
	// the backend keeps whatever the store still lists.
	m.pruneImageState()
	return err
}

// pruneImageState lets a backend that derives state of its own from
// images (backend.ImagePruner: gvisor's per-image roots) remove that of
// the images no longer in the store: after an image rm, and at Start for
// what a crash between the store's removal and this left. It keeps the
// store's images and those of every sandbox the manager knows, in any
// state (one being destroyed may still have its image in use); the
// backend keeps, besides, what its own sandboxes use. Best effort: a
// failure is logged, and the next image rm or start tries again.
func (m *Manager) pruneImageState() {
	p, ok := m.be.(backend.ImagePruner)
	if !ok {
		return
	}
	var keep []string
	if m.cfg.Images != nil {
		for _, im := range m.cfg.Images.List() {
			keep = append(keep, im.Digest)
		}
	}
	m.mu.Lock()
	for _, r := range m.boxes {
		if r.ImageDigest != "" {
			keep = append(keep, r.ImageDigest)
		}
	}
	m.mu.Unlock()
	n, err := p.PruneImages(keep)
	if n > 0 {
		m.log.Info("removed the backend's state of images no longer in the store", "images", n)
	}
	if err != nil {
		m.log.Warn("the backend could not remove its state of images no longer in the store; the next image rm or start retries", "error", err)
	}
}

// checkImageTaken is reserve's check that rec's image is not being
// removed; m.mu must be held.
func (m *Manager) checkImageTaken(rec *record) error {
	if m.removingImages[rec.Image] {
		return &backend.ImageNotFoundError{Name: rec.Image, Known: []string{"(" + rec.Image + " is being removed)"}}
	}
	return nil
}

// ImagePoolSize is the warm pool's configured size for image name.
func (m *Manager) ImagePoolSize(name string) int { return m.poolSize(name) }

// ImageUse counts the sandboxes on each image now, the pool's included.
func (m *Manager) ImageUse() map[string]int {
	m.mu.Lock()
	defer m.mu.Unlock()
	use := map[string]int{}
	for _, r := range m.boxes {
		use[r.Image]++
	}
	return use
}
