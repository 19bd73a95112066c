# ESMM, written the way DeepRec's model zoo writes its multi-task scripts (modelzoo/esmm/train.py; dbmtl,
# mmoe and simple_multitask carry the same guard and flags): Taobao columns in user / item / combo groups,
# embedding columns with do_fusion under --emb_fusion, CTR and CVR towers, pCTCVR = pCTR * pCVR,
# MonitoredTrainingSession for training and ChiefSessionCreator + MonitoredSession for evaluation, and the
# stock-TensorFlow guard run before main(). Sizes are small so a test runs it in seconds.
# The lines a DeepRec user changes: the import below, and the one line of check_DeepRec_features()
# (docs/porting-deeprec.md, "The multi-task scripts' guard").

import argparse
import collections
import math
import os
import sys

from smartstage.compat import tf  # DeepRec: import tensorflow as tf
from tensorflow.python.ops import partitioned_variables

USER_COLUMN = ['user_id', 'cms_segid', 'cms_group_id', 'age_level', 'pvalue_level', 'shopping_level', 'occupation',
               'new_user_class_level']
ITEM_COLUMN = ['adgroup_id', 'cate_id', 'campaign_id', 'customer', 'brand', 'price']
COMBO_COLUMN = ['pid', 'tag_category_list', 'tag_brand_list']
LABEL_COLUMNS = ['clk', 'buy']
TAG_COLUMN = ['tag_category_list', 'tag_brand_list']
HASH_INPUTS = ['pid', 'adgroup_id', 'cate_id', 'campaign_id', 'customer', 'brand', 'user_id', 'cms_segid',
               'cms_group_id', 'final_gender_code', 'age_level', 'pvalue_level', 'shopping_level', 'occupation',
               'new_user_class_level', 'tag_category_list', 'tag_brand_list', 'price']
HASH_BUCKET_SIZE = 200
EMBEDDING_DIMENSION = 8
defaults = [[0]] * len(LABEL_COLUMNS) + [[' ']] * len(HASH_INPUTS)
headers = LABEL_COLUMNS + HASH_INPUTS

args = None  # the parsed flags, global as in the model zoo
RESULTS = {}  # what the test reads: training losses, eval ACC and AUC, the checkpoint directory


class ESMM():
    def __init__(self, input, user_column, item_column, combo_column, mlp=(32, 16), tower_mlp=(16, 8),
                 optimizer_type='adam', learning_rate=0.01, bf16=False, stock_tf=None,
                 input_layer_partitioner=None, dense_layer_partitioner=None):
        self._user_column = user_column
        self._item_column = item_column
        self._combo_column = combo_column
        self._mlp = mlp
        self._tower_mlp = tower_mlp
        self._optimizer_type = optimizer_type
        self._learning_rate = learning_rate
        self._tf = stock_tf
        self._bf16 = False if self._tf else bf16
        self._input_layer_partitioner = input_layer_partitioner
        self._dense_layer_partitioner = dense_layer_partitioner
        self.feature = input[0]
        self.label = input[1]
        self._create_model()
        with tf.name_scope('head'):
            self._create_loss()
            self._create_optimizer()
            self._create_metrics()

    def _add_layer_summary(self, value, tag):
        tf.summary.scalar('%s/fraction_of_zero_values' % tag, tf.nn.zero_fraction(value))
        tf.summary.histogram('%s/activation' % tag, value)

    def _create_loss(self):
        bce_loss_func = tf.keras.losses.BinaryCrossentropy()
        self.probability = tf.squeeze(self.probability)
        self.loss = tf.math.reduce_mean(bce_loss_func(self.label, self.probability))
        tf.summary.scalar('loss', self.loss)

    def _create_optimizer(self):
        self.global_step = tf.train.get_or_create_global_step()
        if (self._tf and self._optimizer_type == 'adamasync') or self._optimizer_type == 'adam':
            optimizer = tf.train.AdamOptimizer(learning_rate=self._learning_rate)
        elif self._optimizer_type == 'adamasync':
            optimizer = tf.train.AdamAsyncOptimizer(learning_rate=self._learning_rate)
        elif self._optimizer_type == 'adagrad':
            optimizer = tf.train.AdagradOptimizer(learning_rate=self._learning_rate)
        elif self._optimizer_type == 'adagraddecay':
            optimizer = tf.train.AdagradDecayOptimizer(learning_rate=self._learning_rate,
                                                       global_step=self.global_step)
        else:
            optimizer = tf.train.GradientDescentOptimizer(learning_rate=self._learning_rate)
        update_ops = tf.get_collection(tf.GraphKeys.UPDATE_OPS)
        with tf.control_dependencies(update_ops):
            self.train_op = optimizer.minimize(self.loss, global_step=self.global_step)

    def _create_metrics(self):
        self.acc, self.acc_op = tf.metrics.accuracy(labels=self.label, predictions=self.output)
        self.auc, self.auc_op = tf.metrics.auc(labels=self.label, predictions=self.probability,
                                               num_thresholds=1000)
        tf.summary.scalar('eval_acc', self.acc)
        tf.summary.scalar('eval_auc', self.auc)

    def _create_dense_layer(self, input, num_hidden_units, activation, layer_name):
        with tf.variable_scope(layer_name, reuse=tf.AUTO_REUSE) as mlp_layer_scope:
            dense_layer = tf.layers.dense(input, units=num_hidden_units, activation=activation,
                                          name=mlp_layer_scope)
            self._add_layer_summary(dense_layer, mlp_layer_scope.name)
        return dense_layer

    def _make_scope(self, name, bf16):
        if bf16:
            return tf.variable_scope(name, reuse=tf.AUTO_REUSE).keep_weights(dtype=tf.float32)
        return tf.variable_scope(name, reuse=tf.AUTO_REUSE)

    def _mlp_on(self, net, scope, units):
        with tf.variable_scope(scope, partitioner=self._dense_layer_partitioner, reuse=tf.AUTO_REUSE):
            for layer_id, num_hidden_units in enumerate(units):
                net = self._create_dense_layer(net, num_hidden_units, tf.nn.relu, f'{scope}_{layer_id}')
        return net

    def _create_model(self):
        with tf.variable_scope('user_input_layer', partitioner=self._input_layer_partitioner, reuse=tf.AUTO_REUSE):
            user_emb = tf.feature_column.input_layer(self.feature, self._user_column)
        with tf.variable_scope('item_input_layer', partitioner=self._input_layer_partitioner, reuse=tf.AUTO_REUSE):
            item_emb = tf.feature_column.input_layer(self.feature, self._item_column)
        with tf.variable_scope('combo_input_layer', partitioner=self._input_layer_partitioner, reuse=tf.AUTO_REUSE):
            for key in TAG_COLUMN:
                self.feature[key] = tf.strings.split(self.feature[key], '|')
            combo_emb = tf.feature_column.input_layer(self.feature, self._combo_column)

        with self._make_scope('ESMM', self._bf16):
            user_emb = self._mlp_on(user_emb, 'user_mlp_layer', self._mlp)
            item_emb = self._mlp_on(item_emb, 'item_mlp_layer', self._mlp)
            combo_emb = self._mlp_on(combo_emb, 'combo_mlp_layer', self._mlp)
            concat = tf.concat([user_emb, item_emb, combo_emb], axis=1)
            pCVR = self._tower(concat, 'cvr_mlp')
            pCTR = self._tower(concat, 'ctr_mlp')
            self.probability = tf.cast(tf.multiply(pCVR, pCTR), tf.float32)
            self.output = tf.round(self.probability)

    def _tower(self, net, scope):
        net = self._mlp_on(net, scope, self._tower_mlp)
        with tf.variable_scope(scope, partitioner=self._dense_layer_partitioner, reuse=tf.AUTO_REUSE):
            return self._create_dense_layer(net, 1, tf.math.sigmoid, f'{scope}_hiddenlayer_last')


def build_model_input(filename, batch_size, num_epochs, seed, stock_tf, workqueue=None):
    def parse_csv(value):
        columns = tf.io.decode_csv(value, record_defaults=defaults)
        all_columns = collections.OrderedDict(zip(headers, columns))
        labels = [all_columns.pop(LABEL_COLUMNS[0]), all_columns.pop(LABEL_COLUMNS[1])]
        label = tf.multiply(labels[0], labels[1])
        return all_columns, label

    if not stock_tf and workqueue:
        from tensorflow.python.ops.work_queue import WorkQueue
        files = WorkQueue([filename]).input_dataset()
    else:
        files = filename
    if args.parquet_dataset and not args.tf:
        from tensorflow.python.data.experimental.ops import parquet_dataset_ops
        dataset = parquet_dataset_ops.ParquetDataset(files, batch_size=batch_size)
    else:
        dataset = tf.data.TextLineDataset(files)
        dataset = dataset.shuffle(buffer_size=10000, seed=seed)
        dataset = dataset.repeat(num_epochs)
        dataset = dataset.batch(batch_size)
        dataset = dataset.map(parse_csv, num_parallel_calls=tf.data.experimental.AUTOTUNE)
    return dataset.prefetch(2)


def build_feature_columns(stock_tf, emb_fusion, emb_variable=None, adaptive_emb=None):
    user_column, item_column, combo_column = [], [], []
    for column_name in HASH_INPUTS:
        column = tf.feature_column.categorical_column_with_hash_bucket(column_name, hash_bucket_size=HASH_BUCKET_SIZE,
                                                                       dtype=tf.string)
        if not stock_tf:
            ev_opt = tf.EmbeddingVariableOption(evict_option=None, filter_option=None)
            if emb_variable:
                column = tf.feature_column.categorical_column_with_embedding(column_name, dtype=tf.string,
                                                                             ev_option=ev_opt)
            elif adaptive_emb:
                column = tf.feature_column.categorical_column_with_adaptive_embedding(
                    column_name, hash_bucket_size=HASH_BUCKET_SIZE, dtype=tf.string, ev_option=ev_opt)
        if not stock_tf and emb_fusion:
            '''Embedding Fusion Feature'''
            embedding_column = tf.feature_column.embedding_column(column, dimension=EMBEDDING_DIMENSION,
                                                                  combiner='mean', do_fusion=emb_fusion)
        else:
            embedding_column = tf.feature_column.embedding_column(column, dimension=EMBEDDING_DIMENSION,
                                                                  combiner='mean')
        if column_name in USER_COLUMN:
            user_column.append(embedding_column)
        elif column_name in ITEM_COLUMN:
            item_column.append(embedding_column)
        elif column_name in COMBO_COLUMN:
            combo_column.append(embedding_column)
    return user_column, item_column, combo_column


def train(sess_config, input_hooks, model, train_init_op, train_steps, keep_checkpoint_max, checkpoint_dir,
          save_steps=None, incremental_ckpt=None, stock_tf=None):
    hooks = list(input_hooks)
    scaffold = tf.train.Scaffold(local_init_op=tf.group(tf.local_variables_initializer(), train_init_op),
                                 saver=tf.train.Saver(max_to_keep=keep_checkpoint_max))
    hooks.append(tf.train.StopAtStepHook(last_step=train_steps))
    hooks.append(tf.train.LoggingTensorHook({'steps': model.global_step, 'loss': model.loss}, every_n_iter=100))
    losses = RESULTS.setdefault('losses', [])
    if not stock_tf and incremental_ckpt:
        raise ValueError('Incremental_Checkpoint has not been enabled yet. Please see comments in the code.')
    with tf.train.MonitoredTrainingSession(
            master='', is_chief=True, hooks=hooks, scaffold=scaffold, checkpoint_dir=checkpoint_dir,
            save_checkpoint_steps=save_steps or train_steps, summary_dir=checkpoint_dir,
            save_summaries_steps=save_steps, config=sess_config) as sess:
        while not sess.should_stop():
            loss, _ = sess.run([model.loss, model.train_op])
            losses.append(loss)
    print('Training completed.')


def eval(sess_config, input_hooks, model, test_init_op, test_steps, output_dir, checkpoint_dir):
    hooks = list(input_hooks)
    scaffold = tf.train.Scaffold(local_init_op=tf.group(tf.local_variables_initializer(), test_init_op))
    session_creator = tf.train.ChiefSessionCreator(scaffold=scaffold, checkpoint_dir=checkpoint_dir,
                                                   config=sess_config)
    writer = tf.summary.FileWriter(os.path.join(output_dir, 'eval'))
    merged = tf.summary.merge_all()
    with tf.train.MonitoredSession(session_creator=session_creator, hooks=hooks) as sess:
        for _in in range(1, test_steps + 1):
            if _in != test_steps:
                sess.run([model.acc_op, model.auc_op])
            else:
                eval_acc, eval_auc, events = sess.run([model.acc_op, model.auc_op, merged])
                writer.add_summary(events, _in)
                print(f'ACC = {eval_acc}\nAUC = {eval_auc}')
                RESULTS.update(acc=eval_acc, auc=eval_auc)
    writer.close()


def main(stock_tf):
    train_file = args.data_location + '/taobao_train_data'
    test_file = args.data_location + '/taobao_test_data'
    if not os.path.exists(train_file) or not os.path.exists(test_file):
        raise ValueError('[ERROR] taobao_train_data or taobao_test_data does not exist in the given data_location.')
    no_of_training_examples = sum(1 for _ in open(train_file))
    no_of_test_examples = sum(1 for _ in open(test_file))
    batch_size = math.ceil(args.batch_size / args.micro_batch) if args.micro_batch and not stock_tf \
        else args.batch_size
    if args.steps == 0:
        no_epochs = 1
        train_steps = math.ceil((float(no_epochs) * no_of_training_examples) / batch_size)
    else:
        no_epochs = math.ceil((float(batch_size) * args.steps) / no_of_training_examples)
        train_steps = args.steps
    test_steps = math.ceil(float(no_of_test_examples) / batch_size)

    SEED = args.seed
    tf.set_random_seed(SEED)
    checkpoint_dir = args.checkpoint_dir if args.checkpoint_dir else os.path.join(args.output_dir, 'model_ESMM')
    RESULTS['checkpoint_dir'] = checkpoint_dir

    train_dataset = build_model_input(train_file, batch_size, no_epochs, SEED, stock_tf, args.workqueue)
    test_dataset = build_model_input(test_file, batch_size, 1, SEED, stock_tf, args.workqueue)
    iterator = tf.data.Iterator.from_structure(tf.data.get_output_types(train_dataset),
                                               tf.data.get_output_shapes(test_dataset))
    next_element = iterator.get_next()
    train_init_op = iterator.make_initializer(train_dataset)
    test_init_op = iterator.make_initializer(test_dataset)

    user_column, item_column, combo_column = build_feature_columns(stock_tf, args.emb_fusion, args.ev,
                                                                   args.adaptive_emb)
    input_layer_partitioner = partitioned_variables.min_max_variable_partitioner(
        max_partitions=0, min_slice_size=args.input_layer_partitioner << 20) if args.input_layer_partitioner else None
    dense_layer_partitioner = partitioned_variables.min_max_variable_partitioner(
        max_partitions=0, min_slice_size=args.dense_layer_partitioner << 10) if args.dense_layer_partitioner else None

    sess_config = tf.ConfigProto()
    sess_config.inter_op_parallelism_threads = args.inter
    sess_config.intra_op_parallelism_threads = args.intra
    hooks = []
    if args.smartstaged and not stock_tf:
        '''SmartStage Feature'''
        next_element = tf.staged(next_element, num_threads=args.stage_threads, capacity=40)
        sess_config.graph_options.optimizer_options.do_smart_stage = args.do_smart_stage
        hooks.append(tf.make_prefetch_hook())
    if args.op_fusion and not stock_tf:
        '''Auto Graph Fusion'''
        sess_config.graph_options.optimizer_options.do_op_fusion = True
    if args.micro_batch and not stock_tf:
        '''Auto Micro Batch'''
        sess_config.graph_options.optimizer_options.micro_batch_num = args.micro_batch

    model = ESMM(next_element, user_column, item_column, combo_column, optimizer_type=args.optimizer,
                 learning_rate=args.learning_rate, bf16=args.bf16, stock_tf=stock_tf,
                 input_layer_partitioner=input_layer_partitioner, dense_layer_partitioner=dense_layer_partitioner)
    RESULTS['model'] = model
    train(sess_config, hooks, model, train_init_op, train_steps, args.keep_checkpoint_max, checkpoint_dir,
          args.save_steps, args.incremental_ckpt, stock_tf)
    if not args.no_eval:
        eval(sess_config, hooks, model, test_init_op, test_steps, checkpoint_dir, checkpoint_dir)


def boolean_string(string):
    low_string = string.lower()
    if low_string not in {'false', 'true'}:
        raise ValueError('Not a valid boolean string')
    return low_string == 'true'


def get_arg_parser():
    parser = argparse.ArgumentParser()
    parser.add_argument('--seed', type=int, default=2020)
    parser.add_argument('--data_location', default='./data')
    parser.add_argument('--steps', type=int, default=0)
    parser.add_argument('--batch_size', type=int, default=512)
    parser.add_argument('--output_dir', default='./result')
    parser.add_argument('--checkpoint_dir')
    parser.add_argument('--learning_rate', type=float, default=0.01)
    parser.add_argument('--save_steps', type=int)
    parser.add_argument('--keep_checkpoint_max', type=int, default=1)
    parser.add_argument('--bf16', action='store_true')
    parser.add_argument('--no_eval', action='store_true')
    parser.add_argument('--inter', type=int, default=0)
    parser.add_argument('--intra', type=int, default=0)
    parser.add_argument('--input_layer_partitioner', type=int, default=0)
    parser.add_argument('--dense_layer_partitioner', type=int, default=0)
    parser.add_argument('--tf', action='store_true')
    parser.add_argument('--smartstaged', type=boolean_string, default=True)
    parser.add_argument('--stage_threads', type=int, default=4)  # the model zoo hard-codes num_threads=4
    # False: the same staged graph without the rewrite, the run SmartStage must reproduce exactly.
    parser.add_argument('--do_smart_stage', type=boolean_string, default=True)
    parser.add_argument('--emb_fusion', type=boolean_string, default=True)
    parser.add_argument('--op_fusion', type=boolean_string, default=True)
    parser.add_argument('--micro_batch', type=int, default=0)
    parser.add_argument('--optimizer', type=str, choices=['adam', 'adamasync', 'adagraddecay', 'adagrad',
                                                          'gradientdescent'], default='adamasync')
    parser.add_argument('--ev', type=boolean_string, default=False)
    parser.add_argument('--adaptive_emb', type=boolean_string, default=False)
    parser.add_argument('--dynamic_ev', type=boolean_string, default=False)
    parser.add_argument('--incremental_ckpt', type=int, default=None)
    parser.add_argument('--workqueue', type=boolean_string, default=False)
    parser.add_argument('--parquet_dataset', type=boolean_string, default=True)
    parser.add_argument('--group_embedding', type=str, choices=[None, 'localized', 'collective'], default=None)
    return parser


def set_env_for_DeepRec():
    os.environ['START_STATISTIC_STEP'] = '100'
    os.environ['STOP_STATISTIC_STEP'] = '110'
    os.environ['MALLOC_CONF'] = 'background_thread:true,metadata_thp:auto,dirty_decay_ms:20000,muzzy_decay_ms:20000'
    if args.group_embedding == "collective":
        tf.config.experimental.enable_distributed_strategy(strategy="collective")


def check_stock_tf():
    import pkg_resources
    detailed_version = pkg_resources.get_distribution('Tensorflow').version
    return not ('deeprec' in detailed_version)


def check_DeepRec_features():
    # As shipped: return args.smartstaged or args.emb_fusion or args.op_fusion or args.micro_batch or ...
    # Edited for stock TensorFlow + smartstage (docs/porting-deeprec.md): smartstaged, emb_fusion and op_fusion
    # dropped, every feature stock TensorFlow cannot run kept.
    return args.micro_batch or args.bf16 or \
           args.ev or args.adaptive_emb or args.dynamic_ev or (args.optimizer == 'adamasync') or \
           args.incremental_ckpt  or args.workqueue and args.group_embedding


if __name__ == '__main__':
    parser = get_arg_parser()
    args = parser.parse_args()

    stock_tf = args.tf
    if not stock_tf and check_stock_tf() and check_DeepRec_features():
        raise ValueError('Stock Tensorflow does not support DeepRec features. '
                         'For Stock Tensorflow run the script with `--tf` argument.')

    if not stock_tf:
        set_env_for_DeepRec()

    main(stock_tf)
